"""Import a recipe in a fresh process: a module by name, or a script by path, and the attribute holding it."""

from __future__ import annotations

import importlib
import importlib.util
import sys

from .recipe import Recipe

SCRIPT_MODULE = "__trainmaster_recipe__"


def import_recipe(module_name: str | None, script: str | None, attr: str) -> Recipe:
    if module_name:
        module = importlib.import_module(module_name)
    else:
        spec = importlib.util.spec_from_file_location(SCRIPT_MODULE, script)
        module = importlib.util.module_from_spec(spec)
        sys.modules[SCRIPT_MODULE] = module
        spec.loader.exec_module(module)
    recipe = getattr(module, attr)
    if not isinstance(recipe, Recipe):
        raise TypeError(f"{attr} is a {type(recipe).__name__}, not a Recipe")
    return recipe
