"""From a job spec to the run an audit re-executes: recipe, hyperparameters, seed and k.

A replay audit needs the runtime: the spec's entrypoint must run a shipped recipe,
``python -m trainmaster.jobs.recipes.<module> [--option value ...]``, whose options are the
recipe's config fields (as its command line parses them). Anything else cannot be re-executed
(only the safety and outcome checks apply to it).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from trainmaster.jobs.recipe import Recipe
from trainmaster.jobs.spec import JobSpec, LoadedSpec

from .calibration import job_class
from .errors import VerificationError

RECIPES_PACKAGE = "trainmaster.jobs.recipes."
PRECISIONS = {"fp32", "tf32"}  # what the recipes compute in (TF32 does not exist on CPU; on GPU it is calibrated)


class NotReplayable(VerificationError):
    """The job cannot be re-executed by the audit (its entrypoint is not a runtime recipe)."""

    def __init__(self, reason: str):
        super().__init__(reason, kind="cannot_verify")


@dataclass(frozen=True)
class RecipeRun:
    recipe: Recipe
    config: dict[str, Any]
    """The recipe config in JSON form, as every state records it."""
    seed: int
    k: int

    @property
    def job_class(self) -> str:
        """The calibration class (:func:`trainmaster.verify.calibration.job_class`)."""
        return job_class(self.recipe.name, self.config)


def recipe_run(spec: LoadedSpec | JobSpec) -> RecipeRun:
    """The recipe run a spec describes; :class:`NotReplayable` when it is not one."""
    from trainmaster.jobs.recipes import MODULES, get_recipe
    from trainmaster.jobs.recipes.cli import parser_for

    job = spec.spec if isinstance(spec, LoadedSpec) else spec
    argv = job.argv
    if len(argv) < 3 or argv[1] != "-m" or not argv[2].startswith(RECIPES_PACKAGE):
        raise NotReplayable(f"entrypoint {job.entrypoint!r} does not run a recipe (python -m {RECIPES_PACKAGE}<name>)")
    module = argv[2][len(RECIPES_PACKAGE) :]
    names = {mod: name for name, mod in MODULES.items()}
    if module not in names:
        raise NotReplayable(f"{argv[2]} is not a known recipe module ({', '.join(sorted(names))})")
    if job.precision not in PRECISIONS:
        raise NotReplayable(f"precision {job.precision} is not supported by the replay audit (recipes run in fp32)")
    recipe = get_recipe(names[module])
    parser = parser_for(recipe, module)
    parser.exit_on_error = False
    try:
        args, unknown = parser.parse_known_args(argv[3:])
        if unknown:
            raise NotReplayable(f"the entrypoint passes options the {recipe.name} recipe does not take: {unknown}")
        config = recipe.config({key: value for key, value in vars(args).items() if value is not None})
    except (argparse.ArgumentError, ValidationError) as exc:
        raise NotReplayable(f"the entrypoint's recipe options are invalid: {exc}") from exc
    return RecipeRun(recipe, config.model_dump(mode="json"), job.seed, job.checkpoint.segment_steps)
