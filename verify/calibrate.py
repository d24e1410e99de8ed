"""Calibrating a job class: measure honest and cheating r at each segment length k, derive τ(k).

For each seed the recipe is trained once from scratch, and base states are taken across the whole
run: the first boundary (a multiple of the smallest k, from ``warmup`` on) after which the weights
move — early learning, where updates are largest — and the rest evenly spaced up to the last step a
segment of the largest k can start from. For every k and every executor variant
(:mod:`trainmaster.verify.variants`: other thread count, one-ulp nudge, float64; and the mildest
cheat, lr × 0.9) the variant runs k steps from each base as an executor would, and the verifier
re-executes them exactly as an audit does (:func:`trainmaster.jobs.replay.replay_state`, the
variant's decisions forced). A base whose k steps update no weight (DQN before ``learning_starts``,
PPO between rollout ends), or move it by too few ulps to tell a cheat from rounding (the last steps
of a schedule that decays to zero, :data:`~trainmaster.verify.distance.MEASURABLE_ULPS`), says
nothing about r and is left out for that k. The distances r, the
honest decision margins, the honest update sizes and each state-entry group's honest divergence make
the :class:`~trainmaster.verify.calibration.Calibration` (τ, R, margin tolerance, update floor and
ceiling, field tolerances).

Device pairs (``executor``, ``verifier``): the variants run on the executor's kind of device and the
re-executions on the verifier's (``jobs.devices.replaying_on``). On a CPU executor the honest
variants are CPU proxies for other hardware; on a GPU executor they are the plain run on that GPU
(for a cuda→cpu pair: the real cross-device divergence), a one-ulp nudge and float64 — the thread
count changes nothing a GPU computes. Calibrate on the real executor/verifier pair before trusting τ
in production (docs/protocol.md §5); the calibration records both sides' devices.
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
from trainmaster.jobs.devices import describe_device, replaying_on
from trainmaster.jobs.execution import build_trainer, full_state, restore, run_step, state_info
from trainmaster.jobs.recipe import Recipe, RecipeConfig
from trainmaster.jobs.replay import replay_state
from trainmaster.jobs.state import TrainState

from trainmaster.jobs.state_diff import same_bits

from .calibration import Base, Calibration, CalibrationPoint, job_class
from .distance import weight_distance
from .state_rules import compare_rest
from .update_norm import update_per_lr
from .variants import MILDEST_CHEAT, Variant, execute, honest_variants

DEFAULT_KS = (10, 25, 50, 100)


def default_ks(spec_k: int, steps: int) -> list[int]:
    """10, 25, 50, 100 and the spec's k, those that leave at least half the run to spread base states over."""
    return sorted(k for k in {*DEFAULT_KS, spec_k} if k <= steps // 2)
DEFAULT_BASES = 4
"""Base states per seed: where learning starts, and three more spread over the rest of the run."""
Progress = Callable[[str], None]


class CalibrationError(ValueError):
    """The calibration cannot be measured as asked (bad k or warm-up for this run length, no updates)."""


class NoUpdate(CalibrationError):
    """A base state's k steps update no weight, so r cannot be measured from it."""


@dataclass(frozen=True)
class Measurement:
    """One variant's segment, as the audit would see it."""

    r: float
    max_margin: float
    update_per_lr: float
    fields: dict[str, float]
    """r of each rest-entry group compared within a calibrated tolerance (``verify.state_rules``)."""


def calibrate(
    recipe: str | Recipe,
    config: Mapping[str, Any] | RecipeConfig,
    *,
    ks: Sequence[int] = DEFAULT_KS,
    seeds: Sequence[int] = (0, 1, 2),
    bases: int = DEFAULT_BASES,
    warmup: int = 0,
    progress: Progress | None = None,
    executor: str = "cpu",
    verifier: str = "cpu",
) -> Calibration:
    """Train one run per seed on the executor's device, keep ``bases`` states across it (:func:`run_bases`),
    then :func:`calibrate_states` for the (``executor``, ``verifier``) device pair."""
    resolved = _recipe(recipe)
    cfg = config if isinstance(config, RecipeConfig) else resolved.config(config)
    if bases < 1:
        raise CalibrationError(f"at least one base state per seed is needed, not {bases}")
    if warmup + max(ks) > cfg.steps:
        raise CalibrationError(f"warm-up {warmup} + k {max(ks)} exceeds the run's {cfg.steps} steps")
    states = []
    for seed in seeds:
        _say(progress, f"seed {seed}: training up to step {cfg.steps - max(ks)} on {executor}, keeping {bases} base states")
        with replaying_on(executor):
            states.extend(run_bases(resolved, cfg, seed, bases=bases, first=warmup, last=cfg.steps - max(ks), grid=min(ks)))
    return calibrate_states(resolved, states, ks=ks, progress=progress, executor=executor, verifier=verifier)


def run_bases(
    recipe: Recipe, config: RecipeConfig, seed: int, *, bases: int, first: int, last: int, grid: int
) -> list[TrainState]:
    """One run's base states: the first boundary ≥ ``first`` (on a ``grid``) whose next ``grid`` steps move
    the weights, then up to ``bases − 1`` more evenly spaced after it, the last at step ``last``."""
    trainer = build_trainer(recipe, config, seed)
    _train(trainer, seed, 0, first)
    start = first
    while True:
        if start > last:
            raise CalibrationError(f"seed {seed}: no weight moves between step {first} and step {last + grid}")
        early = full_state(trainer, recipe, config, seed, start).snapshot()
        _train(trainer, seed, start, start + grid)
        if _weights_moved(early, full_state(trainer, recipe, config, seed, start + grid)):
            break
        start += grid
    spread = sorted({round(start + j * (last - start) / (bases - 1)) for j in range(1, bases)} - {start}) if bases > 1 else []
    step = start + grid
    if spread and spread[0] < step:  # the search stepped past a base: go back to where learning starts
        trainer, step = build_trainer(recipe, config, seed), start
        restore(trainer, early)
    found = [early]
    for target in spread:
        _train(trainer, seed, step, target)
        step = target
        found.append(full_state(trainer, recipe, config, seed, step).snapshot())
    return found


def _train(trainer, seed: int, start: int, end: int) -> None:
    for step in range(start, end):
        run_step(trainer, seed, step, DecisionLog())


def _weights_moved(before: TrainState, after: TrainState) -> bool:
    return any(not same_bits(tensor, after.weights[name]) for name, tensor in before.weights.items())


def warm_state(recipe: Recipe, config: RecipeConfig, seed: int, steps: int) -> TrainState:
    """The full state after training ``steps`` steps from scratch (as the runtime would)."""
    trainer = build_trainer(recipe, config, seed)
    _train(trainer, seed, 0, steps)
    return full_state(trainer, recipe, config, seed, steps).snapshot()


def calibrate_states(
    recipe: str | Recipe,
    states: Sequence[TrainState],
    *,
    ks: Sequence[int] = DEFAULT_KS,
    progress: Progress | None = None,
    executor: str = "cpu",
    verifier: str = "cpu",
) -> Calibration:
    """Measure every variant for every k from each base state (all of one recipe and config), the variants
    run on the ``executor``'s kind of device and the re-executions on the ``verifier``'s."""
    resolved = _recipe(recipe)
    infos = [state_info(state) for state in states]
    if not infos or any(info.config != infos[0].config or info.recipe != resolved.name for info in infos):
        raise CalibrationError(f"calibration needs base states of one {resolved.name} config")
    honest = honest_variants(executor)
    variants = (*honest, MILDEST_CHEAT)
    found: dict[int, dict[str, list[Measurement]]] = {k: {v.name: [] for v in variants} for k in ks}
    for state, info in zip(states, infos, strict=True):
        for k in ks:
            _say(progress, f"seed {info.seed}, step {info.step}: k = {k}")
            try:
                measured = {
                    variant.name: measure(resolved, state, k, variant, executor=executor, verifier=verifier,
                                          honest=variant in honest)
                    for variant in variants
                }
            except NoUpdate as exc:
                if len(states) == 1:
                    raise
                _say(progress, f"  left out: {exc}")
                continue
            for name, measurement in measured.items():
                found[k][name].append(measurement)
    if empty := [k for k in ks if not found[k][MILDEST_CHEAT.name]]:
        raise CalibrationError(f"no base state's segment of k = {empty[0]} steps updates a weight: warm up past the start of learning")
    return Calibration(
        job_class=job_class(resolved.name, infos[0].config),
        executor=executor,
        verifier=verifier,
        recipe=resolved.name,
        config=infos[0].config,
        bases=[Base(seed=info.seed, step=info.step) for info in infos],
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        environment=_environment(resolved.config(infos[0].config), executor, verifier),
        points=[_point(k, found[k], honest) for k in sorted(ks)],
    )


def measure(
    recipe: Recipe,
    state: TrainState,
    k: int,
    variant: Variant,
    *,
    executor: str = "cpu",
    verifier: str = "cpu",
    honest: bool | None = None,
) -> Measurement:
    """Run ``variant`` as the executor from ``state`` (on the executor's device), then re-execute as the audit
    does (on the verifier's)."""
    with replaying_on(executor):
        executed = execute(recipe, state, k, variant)
    info = state_info(state)
    with replaying_on(verifier):
        replay = replay_state(recipe, state, k, executed.trace, info.config)
    distance = weight_distance(state.weights, replay.weights, executed.state.weights)
    if distance.update == 0:
        raise NoUpdate(
            f"the re-execution of steps {info.step}..{info.step + k - 1} updates no weight: warm up past the start of learning"
        )
    if not distance.measurable:
        raise NoUpdate(
            f"steps {info.step}..{info.step + k - 1} move the weights by only {distance.update / distance.rounding:.3g} "
            "ulp-norms: too little to tell a cheat from rounding"
        )
    rest = compare_rest(recipe.rules, state.rest, replay.state.rest, executed.state.rest)
    if (variant is not MILDEST_CHEAT if honest is None else honest) and (rest.problems or rest.exact_mismatches):
        raise CalibrationError(
            f"the honest variant {variant.name!r} does not reproduce the recipe's state as its rules demand: "
            + "; ".join(rest.problems[:3] + rest.differences)
        )
    fields = {pattern: group.r for pattern, group in rest.groups.items() if group.rule != "reported"}
    return Measurement(distance.raw_r, replay.decisions.max_margin, update_per_lr(distance, replay), fields)


def _point(k: int, found: Mapping[str, list[Measurement]], variants: Sequence[Variant]) -> CalibrationPoint:
    honest = {v.name: found[v.name] for v in variants}
    return CalibrationPoint.from_measurements(
        k,
        honest_r={name: [m.r for m in ms] for name, ms in honest.items()},
        cheat_r={MILDEST_CHEAT.name: [m.r for m in found[MILDEST_CHEAT.name]]},
        honest_margins=[m.max_margin for ms in honest.values() for m in ms],
        updates_per_lr=[m.update_per_lr for ms in honest.values() for m in ms],
        honest_fields=_by_pattern(m.fields for ms in honest.values() for m in ms),
        cheat_fields=_by_pattern(m.fields for m in found[MILDEST_CHEAT.name]),
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


def _environment(config: RecipeConfig, executor: str = "cpu", verifier: str = "cpu") -> dict[str, str]:
    found = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
        "threads": str(config.threads),
        "device": verifier if executor == verifier else f"{executor}→{verifier}",
    }
    for side, kind in (("executor", executor), ("verifier", verifier)):
        found.update({f"{side}_{key}": value for key, value in describe_device(kind).items() if key != "torch"})
    return found


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)
