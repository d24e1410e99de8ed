"""Reference recipes on the runtime: ``dqn`` and ``ppo`` (CartPole-v1) and ``tiny-lm``.

Each is runnable as ``python -m trainmaster.jobs.recipes.<module>``; :func:`get_recipe` finds one by
its recipe name (importing its module, and so torch and gymnasium, only then); :func:`shipped_config` gives its
name and config type alone, without torch (``hyperparameters.py``), for what reads a spec's config.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..recipe import Recipe
    from ..recipe_config import RecipeConfig

MODULES = {"dqn": "dqn", "ppo": "ppo", "tiny-lm": "tiny_lm"}


def _known(name: str) -> None:
    if name not in MODULES:
        raise ValueError(f"unknown recipe {name!r}; known: {', '.join(sorted(MODULES))}")


def get_recipe(name: str) -> Recipe:
    """The recipe registered as ``name``."""
    _known(name)
    return importlib.import_module(f"{__name__}.{MODULES[name]}").RECIPE


@dataclass(frozen=True)
class ShippedConfig:
    """A shipped recipe's name and config type: what its command line parses (``options.parse_options``)."""

    name: str
    config_type: type[RecipeConfig]


def shipped_config(name: str) -> ShippedConfig:
    """The recipe registered as ``name``, as far as its config goes (torch is not imported)."""
    from .hyperparameters import CONFIGS

    _known(name)
    return ShippedConfig(name, CONFIGS[name])
