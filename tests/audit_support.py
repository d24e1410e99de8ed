"""Executors for the audit tests: commit runs whose segments are honest, honest-but-different, or faked.

A run is a list of states S_0..S_n and traces of segments 0..n−1; :func:`commit` writes them the way
the runtime does (``jobs.checkpoint.write_segment``) and returns the commitment over them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainmaster.jobs.checkpoint import DECISIONS, REST, WEIGHTS, segment_dir, write_segment, write_segment_bytes
from trainmaster.jobs.commitment import Commitment, build_commitment
from trainmaster.jobs.decisions import DecisionTrace
from trainmaster.jobs.execution import build_trainer, full_state, state_info
from trainmaster.jobs.recipe import Recipe
from trainmaster.jobs.recipes import get_recipe
from trainmaster.jobs.state import TrainState, scalar
from trainmaster.verify.audit import run_audit
from trainmaster.verify.calibration import Calibration
from trainmaster.verify.openings import LocalOpenings
from trainmaster.verify.variants import CHEATS, FREEZES, VERIFIER, Execution, Variant, execute

BUNDLE = "ab" * 32

TINY_LM = {
    "steps": 60, "d_model": 16, "heads": 2, "layers": 1, "seq_len": 16, "batch_size": 4, "threads": 1, "warmup": 10,
    "weight_decay": 0.0,
}
"""A tiny-lm small enough for dozens of runs in a test (about 5 ms a step on one core).

No weight decay: with decoupled decay a manipulated Adam state can only shrink an update down to its
decay part, which the update-norm floor does not flag (docs/audit.md); without it the test of that
check can show a manipulated state at all."""

SegmentFn = Callable[[int, TrainState], Execution]


@dataclass
class Run:
    recipe: Recipe
    seed: int
    k: int
    states: list[TrainState] = field(default_factory=list)
    traces: list[DecisionTrace] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.traces)

    @property
    def config(self) -> dict[str, Any]:
        return state_info(self.states[0]).config


def initial_state(recipe: Recipe, config: Mapping[str, Any], seed: int) -> TrainState:
    cfg = recipe.config(config)
    return full_state(build_trainer(recipe, cfg, seed), recipe, cfg, seed, 0).snapshot()


def train(recipe: str | Recipe, config: Mapping[str, Any], seed: int, k: int, segment: SegmentFn | None = None) -> Run:
    """All n = T/k segments, each produced by ``segment(i, S_i)`` (default: the verifier's own code)."""
    recipe = get_recipe(recipe) if isinstance(recipe, str) else recipe
    run = Run(recipe, seed, k, [initial_state(recipe, config, seed)])
    segment = segment or variant_segments(run.recipe, k, VERIFIER)
    for i in range(recipe.config(config).steps // k):
        executed = segment(i, run.states[-1])
        run.states.append(executed.state)
        run.traces.append(executed.trace)
    return run


def variant_segments(recipe: Recipe, k: int, variant: Variant, faked: set[int] | None = None) -> SegmentFn:
    """Every segment (or those in ``faked``; the others honestly) run as ``variant`` runs them."""

    def segment(i: int, state: TrainState) -> Execution:
        use = variant if faked is None or i in faked else VERIFIER
        return execute(recipe, state, k, use)

    return segment


def commit(run: Run, root: Path, *, job_id: str = "job-a") -> Commitment:
    """Write the run's segments under ``root`` like the runtime, and commit to them."""
    for i, state in enumerate(run.states):
        trace = run.traces[i].to_tensors() if i < run.n else {}
        write_segment(root, i, state, trace, job_id=job_id, recipe=run.recipe.name, step=i * run.k, k=run.k)
    return build_commitment(root, job_id=job_id, bundle_sha256=BUNDLE, n=run.n, k=run.k)


def with_weights(state: TrainState, weights: Mapping[str, torch.Tensor], step: int) -> TrainState:
    """A fabricated state: ``state``'s rest (its step counter moved to ``step``) with other weights."""
    rest = {**state.rest, "runtime/step": scalar(step)}
    return TrainState(weights={n: w.clone() for n, w in weights.items()}, rest=rest)


def interpolate(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor], t: float) -> dict[str, torch.Tensor]:
    """``a + t (b − a)`` for float tensors."""
    return {n: (a[n] + t * (b[n] - a[n])).to(a[n].dtype) if a[n].is_floating_point() else a[n].clone() for n in a}


def update_size(run: Run, i: int) -> float:
    """‖W_{i+1} − W_i‖ as committed (what a magnitude-based picker ranks by)."""
    a, b = run.states[i].weights, run.states[i + 1].weights
    return sum(float((b[n].double() - a[n].double()).square().sum()) for n in a if a[n].is_floating_point()) ** 0.5


def with_segment(run: Run, j: int, executed: Execution) -> Run:
    """``run`` whose segment j is what an executor committed instead."""
    states, traces = list(run.states), list(run.traces)
    states[j + 1], traces[j] = executed.state, executed.trace
    return Run(run.recipe, run.seed, run.k, states, traces)


def audit_one(run: Run, j: int, root: Path, calibration: Calibration):
    """Commit ``run`` under ``root`` and audit its segment j alone: (report, that segment's evidence)."""
    report = run_audit(
        commitment=commit(run, root), openings=LocalOpenings(root), segments=[j],
        recipe=run.recipe.name, config=run.config, seed=run.seed, calibration=calibration,
    )
    return report, report.segments[0]


def commit_files(run: Run, root: Path, files: Mapping[tuple[int, str], bytes], *, job_id: str = "job-a") -> Commitment:
    """Commit ``run`` like :func:`commit`, but with some segment files replaced by raw bytes (the executor's own).

    ``files`` maps ``(segment index, file name)`` to the bytes committed instead (hashed as they are).
    """
    commit(run, root, job_id=job_id)
    for i in sorted({i for i, _ in files}):
        here = segment_dir(root, i)
        parts = [files.get((i, name)) or (here / name).read_bytes() for name in (WEIGHTS, REST, DECISIONS)]
        write_segment_bytes(root, i, *([part] for part in parts), job_id=job_id, recipe=run.recipe.name, step=i * run.k, k=run.k)
    return build_commitment(root, job_id=job_id, bundle_sha256=BUNDLE, n=run.n, k=run.k)


def frozen(state: TrainState, factor: float = 1e12) -> TrainState:
    """``state`` with Adam's second moments multiplied by ``factor``: training on from it barely moves."""
    rest = {name: t * factor if name.endswith("/exp_avg_sq") else t for name, t in state.rest.items()}
    return TrainState(weights=dict(state.weights), rest=rest)


def walking_to(recipe: Recipe, state: TrainState, k: int, target: Mapping[str, torch.Tensor]) -> TrainState:
    """``state`` with Adam moments crafted so that k honest steps from it end at ``target`` (deliver chosen weights).

    Second moments of 1e6 drown the gradients, so each step moves every weight by the same multiple
    of its first moment: one trial run measures that multiple, and the moments are scaled to cover
    ``target − W``.
    """
    names = _optimized_weights(recipe, state)
    distance = {name: target[name] - state.weights[name] for name in names.values()}

    def crafted(scale: float) -> TrainState:
        rest = dict(state.rest)
        for key in list(rest):
            parts = key.split("/")
            if parts[-1] in ("exp_avg", "exp_avg_sq") and parts[-2].isdigit() and int(parts[-2]) in names:
                name = names[int(parts[-2])]
                rest[key] = torch.full_like(rest[key], 1e6) if parts[-1] == "exp_avg_sq" else -scale * 1e3 * distance[name]
        return TrainState(weights=dict(state.weights), rest=rest)

    trial = execute(recipe, crafted(1.0), k).state.weights
    moved = sum(float(((trial[n] - state.weights[n]) * distance[n]).sum()) for n in names.values())
    return crafted(sum(float(d.square().sum()) for d in distance.values()) / moved)


def _optimized_weights(recipe: Recipe, state: TrainState) -> dict[int, str]:
    """Optimizer parameter index → weight name, from the recipe's own trainer."""
    info = state_info(state)
    trainer = build_trainer(recipe, recipe.config(info.config), info.seed)
    optimizer = next(v for v in vars(trainer).values() if isinstance(v, torch.optim.Optimizer))
    modules = [v for v in vars(trainer).values() if isinstance(v, torch.nn.Module)]
    named = {id(p): name for module in modules for name, p in module.named_parameters() if name in state.weights}
    return {i: named[id(p)] for i, p in enumerate(optimizer.param_groups[0]["params"])}


def rl_cheats(recipe: Recipe) -> dict[str, Callable[[TrainState, int], Execution]]:
    """The cheats every RL recipe's audit must catch: the generic variants, a half update, a freeze
    through the optimizer's eps, and an S_{i+1} with inflated second moments (training stops there)."""

    def variant(cheat: Variant) -> Callable[[TrainState, int], Execution]:
        return lambda state, k: execute(recipe, state, k, cheat)

    def half_update(state: TrainState, k: int) -> Execution:
        """Commits halfway between W_i and the honest W_{i+1}."""
        honest = execute(recipe, state, k)
        weights = interpolate(state.weights, honest.state.weights, 0.5)
        return Execution(with_weights(honest.state, weights, state_info(state).step + k), honest.trace)

    def frozen_after(state: TrainState, k: int) -> Execution:
        honest = execute(recipe, state, k)
        return Execution(frozen(honest.state), honest.trace)

    return {
        **{cheat.name: variant(cheat) for cheat in (*CHEATS, FREEZES[0])},
        "half_update": half_update,
        "frozen_after": frozen_after,
    }
