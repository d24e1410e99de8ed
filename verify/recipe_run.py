"""From a job spec to the run an audit re-executes: recipe, hyperparameters, seed and k.

A replay audit needs the runtime. The spec names the recipe either in ``recipe: module:attr`` —
a module of the bundle's own code (:class:`UserRecipeRun`: never imported in the broker's process;
``verify/recipe_audit.py`` audits it in a child process) or a shipped one,
``trainmaster.jobs.recipes.<module>:RECIPE`` — or, without ``recipe:``, by an entrypoint that runs a
shipped recipe, ``python -m trainmaster.jobs.recipes.<module>``. Either way the recipe's config is
the entrypoint's options after the script or module (``python train.py --lr 0.05``), parsed as the
recipe's own command line parses them (``jobs/recipes/options.py``: one ``--option`` per config field,
validated by the config type, its defaults for the rest), with the spec's ``env`` expanded as the job's command is:
the config comes from the spec, never from the executor. Anything else cannot be re-executed (only
the safety and outcome checks apply to it), and neither can a run of more than one process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainmaster.jobs.environment import expand_command
from trainmaster.jobs.spec import PYTHON_NAMES, SHIPPED_RECIPES, JobSpec, LoadedSpec

from .errors import VerificationError

if TYPE_CHECKING:
    from trainmaster.jobs.recipe import Recipe
    from trainmaster.jobs.recipes.options import Configurable

RECIPES_PACKAGE = SHIPPED_RECIPES
PRECISIONS = {"fp32"}
"""What runtime recipes compute in: true fp32 on every device (``jobs/devices.py`` turns TF32 off on a GPU).
TF32 and bf16 change every step's rounding far beyond what the calibrations measured, so a spec asking for
them is refused at submit when its run would be audited (:func:`precision_refusal`)."""


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
        from .calibration import job_class  # torch-heavy: the broker asks this module about specs at submit

        return job_class(self.recipe.name, self.config)


@dataclass(frozen=True)
class UserRecipeRun:
    """A recipe of the job's own bundle: where it is and what the spec says about it, nothing imported."""

    target: str
    """``module:attr`` inside the bundle's code directory."""
    options: tuple[str, ...]
    """The entrypoint's options: the recipe's config, parsed by its own command line in the audit's child."""
    seed: int
    k: int


def user_recipe(spec: LoadedSpec | JobSpec) -> UserRecipeRun | None:
    """The spec's own recipe (``recipe:`` naming a module of the bundle), or None when it names none or a
    shipped one; :class:`NotReplayable` when it cannot be re-executed."""
    job = spec.spec if isinstance(spec, LoadedSpec) else spec
    if job.bundle_recipe is None:
        return None
    options = _replayable(job)
    return UserRecipeRun(job.recipe, tuple(options), job.seed, job.checkpoint.segment_steps)


def recipe_run(spec: LoadedSpec | JobSpec) -> RecipeRun:
    """The run of a shipped recipe a spec describes; :class:`NotReplayable` when it is not one."""
    from trainmaster.jobs.recipes import get_recipe

    job = spec.spec if isinstance(spec, LoadedSpec) else spec
    name, module, options = _shipped(job)
    recipe = get_recipe(name)
    config = parse_config(recipe, options, module)
    return RecipeRun(recipe, config, job.seed, job.checkpoint.segment_steps)


def recipe_config(spec: LoadedSpec | JobSpec) -> dict[str, Any]:
    """The config (JSON form) of the shipped recipe a spec runs, as :func:`recipe_run` gives it, read without
    importing the recipe (and so torch): what the broker and the verification need of it, T above all, at the cost
    of a few milliseconds where the recipe's module costs seconds. :class:`NotReplayable` when it runs none."""
    from trainmaster.jobs.recipes import shipped_config

    job = spec.spec if isinstance(spec, LoadedSpec) else spec
    name, module, options = _shipped(job)
    return parse_config(shipped_config(name), options, module)


def _shipped(job: JobSpec) -> tuple[str, str, list[str]]:
    """The shipped recipe's name, its module and the entrypoint's options; NotReplayable when it runs none."""
    from trainmaster.jobs.recipes import MODULES

    if job.bundle_recipe is not None:
        raise NotReplayable(f"recipe {job.recipe} is the job's own: it is audited in a child process, from the bundle")
    argv = _argv(job)
    if job.recipe is not None:
        module = job.recipe.partition(":")[0][len(RECIPES_PACKAGE) :]
    elif len(argv) >= 3 and argv[1] == "-m" and argv[2].startswith(RECIPES_PACKAGE):
        module = argv[2][len(RECIPES_PACKAGE) :]
    else:
        raise NotReplayable(
            f"entrypoint {job.entrypoint!r} does not run a recipe (python -m {RECIPES_PACKAGE}<name>, or a script with "
            "the spec's `recipe: module:attr`)"
        )
    names = {mod: name for name, mod in MODULES.items()}
    if module not in names:
        raise NotReplayable(f"{RECIPES_PACKAGE}{module} is not a known recipe module ({', '.join(sorted(names))})")
    if job.recipe is not None and job.recipe.partition(":")[2] != "RECIPE":
        raise NotReplayable(f"recipe {job.recipe}: a shipped recipe module holds its recipe as RECIPE")
    return names[module], module, _replayable(job)


def parse_config(recipe: Configurable, options: list[str], module: str | None = None) -> dict[str, Any]:
    """The recipe config (JSON form) that ``options`` give on the recipe's command line; NotReplayable if invalid."""
    from trainmaster.jobs.recipes.options import OptionsError, parse_options

    try:
        config = parse_options(recipe, options, module)
    except OptionsError as exc:
        raise NotReplayable(f"the entrypoint's recipe options are invalid: {exc}") from exc
    return config.model_dump(mode="json")


def runs_runtime_recipe(job: JobSpec) -> bool:
    """Whether the job trains through the runtime, so that it commits to its states: it names a ``recipe:``
    or its entrypoint is ``python -m trainmaster.jobs.recipes.<name>``."""
    return job.recipe is not None or _runs_shipped_module(job)


def precision_refusal(job: JobSpec) -> str | None:
    """Why a runtime recipe at the spec's precision cannot be replay-audited, or None when it can."""
    if job.precision in PRECISIONS or not runs_runtime_recipe(job):
        return None
    return (
        f"a runtime recipe at precision {job.precision} cannot be replay-audited: the runtime computes in true fp32 "
        "(TF32 off, deterministic kernels, docs/runtime.md Devices) and no calibration covers "
        f"{job.precision} replays (precision: fp32, or a trusted backend with verification.replay_audit: never)"
    )


def processes_refusal(job: JobSpec) -> str | None:
    """Why a runtime recipe run by this many processes cannot be replayed, or None when it can."""
    processes = job.resources.nproc * job.resources.nodes
    if processes == 1 or not runs_runtime_recipe(job):
        return None
    return (
        f"a runtime recipe run by {processes} processes cannot be replay-audited: the audit re-executes segments "
        "with one process (resources.processes: 1, or a trusted backend with verification.replay_audit: never)"
    )


def _replayable(job: JobSpec) -> list[str]:
    """The entrypoint's recipe options, once the run is known to be replayable."""
    if refusal := processes_refusal(job):
        raise NotReplayable(refusal)
    if refusal := precision_refusal(job):
        raise NotReplayable(refusal)
    argv = _argv(job)
    if argv[0] not in PYTHON_NAMES or len(argv) < 2 or (argv[1] == "-m" and len(argv) < 3):
        raise NotReplayable(
            f"entrypoint {job.entrypoint!r}: the audit reads the recipe's config from `python SCRIPT --option value …` "
            "or `python -m MODULE --option value …`"
        )
    return argv[3:] if argv[1] == "-m" else argv[2:]


def _argv(job: JobSpec) -> list[str]:
    """The entrypoint's words with the spec's own env expanded (never the executor's environment)."""
    return expand_command(job.entrypoint, job.env)


def _runs_shipped_module(job: JobSpec) -> bool:
    argv = job.argv
    return len(argv) >= 3 and argv[1] == "-m" and argv[2].startswith(RECIPES_PACKAGE)
