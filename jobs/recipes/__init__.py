"""Reference recipes on the runtime: ``dqn`` and ``ppo`` (CartPole-v1) and ``tiny-lm``.

Each is runnable as ``python -m trainmaster.jobs.recipes.<module>``; :func:`get_recipe` finds one by
its recipe name (importing its module, and so torch and gymnasium, only then).
"""

from __future__ import annotations

import importlib

from ..recipe import Recipe

MODULES = {"dqn": "dqn", "ppo": "ppo", "tiny-lm": "tiny_lm"}


def get_recipe(name: str) -> Recipe:
    """The recipe registered as ``name``."""
    if name not in MODULES:
        raise ValueError(f"unknown recipe {name!r}; known: {', '.join(sorted(MODULES))}")
    return importlib.import_module(f"{__name__}.{MODULES[name]}").RECIPE
