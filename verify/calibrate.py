"""Calibrating a job class: measure honest and cheating r at each segment length k, derive τ(k).

For each seed the recipe is trained ``warmup`` steps from scratch (so segments are mid-training),
giving a base state S. For every k and every executor variant (:mod:`trainmaster.verify.variants`:
other thread count, one-ulp nudge, float64; and the mildest cheat, lr × 0.9) the variant runs k
steps from S as an executor would, and the verifier re-executes them exactly as an audit does
(:func:`trainmaster.jobs.replay.replay_state`, the variant's decisions forced).
The distances r, the honest decision margins and the honest update sizes make the
:class:`~trainmaster.verify.calibration.Calibration` (τ, R, margin tolerance, update floor).

These honest variants are CPU proxies for other hardware; calibrate on the real executor/verifier
GPU pair before trusting τ in production (docs/protocol.md §5).
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import torch

from trainmaster.jobs.decisions import DecisionLog
from trainmaster.jobs.execution import build_trainer, full_state, run_step, state_info
from trainmaster.jobs.recipe import Recipe, RecipeConfig
from trainmaster.jobs.replay import replay_state
from trainmaster.jobs.state import TrainState

from .calibration import Base, Calibration, CalibrationPoint, job_class
from .distance import weight_distance
from .state_rules import compare_rest
from .update_norm import update_per_lr
from .variants import HONEST_VARIANTS, MILDEST_CHEAT, Variant, execute

DEFAULT_KS = (10, 25, 50, 100)
Progress = Callable[[str], None]


class CalibrationError(ValueError):
    """The calibration cannot be measured as asked (bad k or warm-up for this run length, no updates)."""


@dataclass(frozen=True)
class Measurement:
    """One variant's segment, as the audit would see it."""

    r: float
    max_margin: float
    update_per_lr: float
    fields: dict[str, float]
    """r of each rest-entry group compared within a tolerance (``verify.state_rules``)."""


def calibrate(
    recipe: str | Recipe,
    config: Mapping[str, Any] | RecipeConfig,
    *,
    ks: Sequence[int] = DEFAULT_KS,
    seeds: Sequence[int] = (0, 1, 2),
    warmup: int | None = None,
    progress: Progress | None = None,
) -> Calibration:
    """Warm up one base state per seed, then :func:`calibrate_states` from them."""
    resolved = _recipe(recipe)
    cfg = config if isinstance(config, RecipeConfig) else resolved.config(config)
    warmup = default_warmup(cfg, ks) if warmup is None else warmup
    if warmup + max(ks) > cfg.steps:
        raise CalibrationError(f"warm-up {warmup} + k {max(ks)} exceeds the run's {cfg.steps} steps")
    bases = []
    for seed in seeds:
        _say(progress, f"seed {seed}: training {warmup} warm-up steps")
        bases.append(warm_state(resolved, cfg, seed, warmup))
    return calibrate_states(resolved, bases, ks=ks, progress=progress)


def default_warmup(config: RecipeConfig, ks: Sequence[int]) -> int:
    """A quarter of the run, so segments are mid-training, leaving room for the longest k."""
    return max(0, min(config.steps // 4, config.steps - max(ks)))


def warm_state(recipe: Recipe, config: RecipeConfig, seed: int, steps: int) -> TrainState:
    """The full state after training ``steps`` steps from scratch (as the runtime would)."""
    trainer = build_trainer(recipe, config, seed)
    for step in range(steps):
        run_step(trainer, seed, step, DecisionLog())
    return full_state(trainer, recipe, config, seed, steps).snapshot()


def calibrate_states(
    recipe: str | Recipe, states: Sequence[TrainState], *, ks: Sequence[int] = DEFAULT_KS, progress: Progress | None = None
) -> Calibration:
    """Measure every variant for every k from each base state (all of one recipe and config)."""
    resolved = _recipe(recipe)
    infos = [state_info(state) for state in states]
    if not infos or any(info.config != infos[0].config or info.recipe != resolved.name for info in infos):
        raise CalibrationError(f"calibration needs base states of one {resolved.name} config")
    variants = (*HONEST_VARIANTS, MILDEST_CHEAT)
    found: dict[int, dict[str, list[Measurement]]] = {k: {v.name: [] for v in variants} for k in ks}
    for state, info in zip(states, infos, strict=True):
        for k in ks:
            _say(progress, f"seed {info.seed}, step {info.step}: k = {k}")
            for variant in variants:
                found[k][variant.name].append(measure(resolved, state, k, variant))
    return Calibration(
        job_class=job_class(resolved.name, infos[0].config),
        recipe=resolved.name,
        config=infos[0].config,
        bases=[Base(seed=info.seed, step=info.step) for info in infos],
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        environment=_environment(resolved.config(infos[0].config)),
        points=[_point(k, found[k]) for k in sorted(ks)],
    )


def measure(recipe: Recipe, state: TrainState, k: int, variant: Variant) -> Measurement:
    """Run ``variant`` as the executor from ``state``, then re-execute as the audit does."""
    executed = execute(recipe, state, k, variant)
    info = state_info(state)
    replay = replay_state(recipe, state, k, executed.trace, info.config)
    distance = weight_distance(state.weights, replay.weights, executed.state.weights)
    if distance.update == 0:
        raise CalibrationError(
            f"the re-execution of steps {info.step}..{info.step + k - 1} updates no weight: warm up past the start of learning"
        )
    rest = compare_rest(recipe.rules, state.rest, replay.state.rest, executed.state.rest)
    if variant in HONEST_VARIANTS and (rest.problems or rest.exact_mismatches):
        raise CalibrationError(
            f"the honest variant {variant.name!r} does not reproduce the recipe's state as its rules demand: "
            + "; ".join(rest.problems[:3] + rest.differences)
        )
    fields = {pattern: group.r for pattern, group in rest.groups.items()}
    return Measurement(distance.r, replay.decisions.max_margin, update_per_lr(distance, replay.state.rest), fields)


def _point(k: int, found: Mapping[str, list[Measurement]]) -> CalibrationPoint:
    honest = {v.name: found[v.name] for v in HONEST_VARIANTS}
    return CalibrationPoint.from_measurements(
        k,
        honest_r={name: [m.r for m in ms] for name, ms in honest.items()},
        cheat_r={MILDEST_CHEAT.name: [m.r for m in found[MILDEST_CHEAT.name]]},
        honest_margins=[m.max_margin for ms in honest.values() for m in ms],
        updates_per_lr=[m.update_per_lr for ms in honest.values() for m in ms],
        honest_fields=_by_pattern(m.fields for ms in honest.values() for m in ms),
    )


def _by_pattern(measured: Iterable[Mapping[str, float]]) -> dict[str, list[float]]:
    groups: dict[str, list[float]] = {}
    for fields in measured:
        for pattern, r in fields.items():
            groups.setdefault(pattern, []).append(r)
    return groups


def _recipe(recipe: str | Recipe) -> Recipe:
    from trainmaster.jobs.recipes import get_recipe

    return recipe if isinstance(recipe, Recipe) else get_recipe(recipe)


def _environment(config: RecipeConfig) -> dict[str, str]:
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
        "threads": str(config.threads),
        "device": "cpu",
    }


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)
