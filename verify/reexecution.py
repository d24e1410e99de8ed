"""The verifier's re-execution of one segment, from a state already in memory.

This is :func:`trainmaster.jobs.replay.replay_segment` without its first line (reading S_i from a
directory): the audit holds S_i in memory once its opening is checked, and a write-and-read round
trip through the canonical files costs a third of the audit's per-segment overhead on small models.
Same checks, same calls, same :class:`~trainmaster.jobs.replay.ReplayResult`. When ``jobs.replay``
exposes the in-memory half itself, this module should become a call to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainmaster.jobs.decisions import DecisionLog, DecisionTrace
from trainmaster.jobs.execution import StateError, build_trainer, full_state, restore, run_step, state_info
from trainmaster.jobs.recipe import Recipe
from trainmaster.jobs.replay import ReplayResult
from trainmaster.jobs.state import TrainState


def reexecute(
    recipe: Recipe, state: TrainState, k: int, forced: DecisionTrace | None, config: Mapping[str, Any]
) -> ReplayResult:
    """Run ``k`` steps from ``state`` as the verifier, following ``forced`` decisions when given.

    The state must record ``recipe`` and ``config`` (the spec's); raises :class:`StateError`
    otherwise, and :class:`~trainmaster.jobs.decisions.DecisionTraceError` for a trace that does
    not fit the steps.
    """
    info = state_info(state)
    if info.recipe != recipe.name:
        raise StateError(f"the state was trained by recipe {info.recipe!r}, not {recipe.name!r}")
    if dict(config) != info.config:
        raise StateError(f"the state's config {info.config} is not the expected {dict(config)}")
    cfg = recipe.config(info.config)
    if k < 1 or info.step + k > cfg.steps:
        raise StateError(f"cannot replay {k} steps from step {info.step} of a {cfg.steps}-step run")
    trainer = build_trainer(recipe, cfg, info.seed)
    restore(trainer, state)
    decisions = DecisionLog(forced=forced)
    for step in range(info.step, info.step + k):
        run_step(trainer, info.seed, step, decisions)
    decisions.check_complete()
    end = full_state(trainer, recipe, cfg, info.seed, info.step + k)
    return ReplayResult(info.step, info.step + k, end, decisions.trace, decisions.report())
