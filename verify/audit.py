"""The replay audit: re-execute the challenged segments on trusted compute and compare.

API::

    run_audit(*, commitment, openings, segments, recipe, config, seed,
              tau=None, calibration=None, trusted_exact=False, margin_tol=None) -> AuditReport

* ``commitment`` — the executor's :class:`~trainmaster.jobs.commitment.Commitment` (its signature and
  n, k against the spec are checked before, by :mod:`trainmaster.verify.signing`).
* ``openings`` — an :class:`~trainmaster.verify.openings.Openings` (``LocalOpenings(checkpoint_dir)``).
* ``segments`` — the challenged indices (``challenge.draw_segments``: q uniform + 0 and n−1).
* ``recipe``, ``config``, ``seed`` — what the job spec fixes (:func:`trainmaster.verify.recipe_run.recipe_run`):
  a recipe name or :class:`~trainmaster.jobs.recipe.Recipe`, its hyperparameters, the job seed.
* ``tau`` — an explicit threshold; otherwise ``calibration`` (a
  :class:`~trainmaster.verify.calibration.Calibration` of this job class) gives τ(k), the
  decision-margin tolerance and the update-norm floor. With neither, :class:`UncalibratedError`.
* ``trusted_exact`` — the executor is one of our own deterministic backends: require r = 0
  (bitwise identical weights) and no decision disagreement at all.

Per challenged segment i (docs/protocol.md §4, §6; docs/audit.md):

1. open S_i, trace_i, W_{i+1} and sha256(rest_{i+1}); check them against the root;
2. S_i must be of this job (recipe, config, seed, step i·k), and S_0 must be the broker's own S_0;
3. re-execute k steps from S_i here (:func:`trainmaster.jobs.replay.replay_state`, the in-memory
   half of :func:`trainmaster.jobs.replay.replay_segment`) with the executor's decisions forced,
   counting disagreements and their margins;
4. ``r_i = ‖W_exec − W_re‖ / ‖W_re − W_i‖``; reject when ``r_i > τ(k)``, when the update per lr is
   under the calibrated floor, or when a decision margin is over the tolerance;
5. RL recipes: open the rest of S_{i+1} and require its environment and data parts to be bit-exact.

Rejections never raise: they are reasons in the report. Exceptions are for a caller's mistake
(ValueError) and for an audit that cannot run (:class:`UncalibratedError`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from trainmaster.jobs.canonical import state_sha256
from trainmaster.jobs.commitment import Commitment
from trainmaster.jobs.decisions import DecisionTraceError
from trainmaster.jobs.execution import StateError, build_trainer, full_state, state_info
from trainmaster.jobs.recipe import Recipe, RecipeConfig
from trainmaster.jobs.replay import ReplayResult, replay_state
from trainmaster.jobs.state import TrainState

from .calibration import Calibration, UncalibratedError, job_class
from .distance import weight_distance
from .errors import VerificationError
from .evidence import AuditReport, SegmentEvidence, SegmentHashes
from .learner import DEFAULT_MARGIN_TOL, DecisionEvidence, exact_mismatches, has_exact_rest
from .openings import CheckedOpening, Openings, OpeningError, open_checked, open_next_state_checked
from .recipe_run import RecipeRun
from .update_norm import update_per_lr

@dataclass(frozen=True)
class Thresholds:
    tau: float
    source: str
    margin_tol: float
    update_floor: float | None
    exact: bool


@dataclass(frozen=True)
class AuditedJob(RecipeRun):
    """The recipe run the spec fixes (recipe, config in JSON form, job seed, k), and so S_0."""

    initial: TrainState
    """S_0 as the broker builds it from the spec."""


def run_audit(
    *,
    commitment: Commitment,
    openings: Openings,
    segments: Sequence[int],
    recipe: str | Recipe,
    config: Mapping[str, Any] | RecipeConfig,
    seed: int,
    tau: float | None = None,
    calibration: Calibration | None = None,
    trusted_exact: bool = False,
    margin_tol: float | None = None,
) -> AuditReport:
    """Audit the challenged ``segments`` of a committed run (see the module docstring)."""
    indices = sorted(set(segments))
    if not indices:
        raise ValueError("no segments to audit")
    if indices[0] < 0 or indices[-1] >= commitment.n:
        raise ValueError(f"challenged segments {indices} are outside 0..{commitment.n - 1}")
    with _torch_threads_kept():
        job = _job(recipe, config, seed, commitment.k)
        limits = _thresholds(job, tau=tau, calibration=calibration, trusted_exact=trusted_exact, margin_tol=margin_tol)
        evidence = [_audit_segment(i, job, commitment, openings, limits) for i in indices]
    return AuditReport(
        passed=all(e.passed for e in evidence),
        reasons=[f"segment {e.index}: {reason}" for e in evidence for reason in e.reasons],
        recipe=job.recipe.name,
        k=job.k,
        tau=limits.tau,
        tau_source=limits.source,
        margin_tol=limits.margin_tol,
        update_floor=limits.update_floor,
        segments=evidence,
        replay_seconds=sum(e.replay_seconds for e in evidence),
    )


def _thresholds(
    job: AuditedJob, *, tau: float | None, calibration: Calibration | None, trusted_exact: bool, margin_tol: float | None
) -> Thresholds:
    """τ and the other limits for this job's k: exact, explicit, or from the job class's calibration."""
    if trusted_exact:
        return Thresholds(0.0, "exact", 0.0, None, True)
    point = None
    if calibration is not None:
        expected = job_class(job.recipe.name, job.config)
        if calibration.job_class != expected:
            raise UncalibratedError(f"the calibration is for job class {calibration.job_class}, this job is {expected}")
        if tau is None:
            point = calibration.point(job.k)
    if tau is None and point is None:
        raise UncalibratedError(
            f"job class {job_class(job.recipe.name, job.config)} is uncalibrated: run `trainmaster verify calibrate` "
            "for it, or give τ explicitly"
        )
    if tau is not None and not tau >= 0:
        raise ValueError(f"tau must be a non-negative number, got {tau}")
    if point is None:
        return Thresholds(float(tau), "explicit", margin_tol if margin_tol is not None else DEFAULT_MARGIN_TOL, None, False)
    return Thresholds(
        point.tau, "calibration", margin_tol if margin_tol is not None else point.margin_tol, point.update_floor, False
    )


def _job(recipe: str | Recipe, config: Mapping[str, Any] | RecipeConfig, seed: int, k: int) -> AuditedJob:
    from trainmaster.jobs.recipes import get_recipe

    resolved = recipe if isinstance(recipe, Recipe) else get_recipe(recipe)
    cfg = resolved.config(config.model_dump(mode="json") if isinstance(config, RecipeConfig) else dict(config))
    initial = full_state(build_trainer(resolved, cfg, seed), resolved, cfg, seed, 0).snapshot()
    return AuditedJob(resolved, cfg.model_dump(mode="json"), seed, k, initial)


def _audit_segment(
    index: int, job: AuditedJob, commitment: Commitment, openings: Openings, limits: Thresholds
) -> SegmentEvidence:
    evidence = SegmentEvidence(index=index, tau=limits.tau, update_floor=limits.update_floor)
    try:
        opening = open_checked(openings, commitment, index)
    except OpeningError as exc:
        return evidence.reject(exc.reason)
    evidence.hashes = SegmentHashes.of(opening.hashes)
    if problems := _identity_problems(opening.state, job, index):
        return evidence.reject(*problems)
    started = time.perf_counter()
    try:
        replay = _replay(job, opening)
    except (StateError, DecisionTraceError) as exc:
        return evidence.reject(f"the segment cannot be re-executed as committed: {exc}")
    except Exception as exc:  # S_i is executor data: whatever it makes the recipe's own code raise, it is refused
        return evidence.reject(f"S_{index} cannot be loaded and re-executed ({type(exc).__name__}: {exc})")
    finally:
        evidence.replay_seconds = time.perf_counter() - started
    evidence.hashes.replay_weights_sha256 = replay.weights_sha256
    _compare_weights(evidence, opening, replay, limits)
    _check_decisions(evidence, replay, limits)
    if has_exact_rest(job.recipe.name):
        _check_exact_rest(evidence, job, openings, opening, replay)
    return evidence


def _identity_problems(state: TrainState, job: AuditedJob, index: int) -> list[str]:
    """Whether S_i belongs to this job at this point (a replayed result from another job fails here)."""
    try:
        info = state_info(state)
    except StateError as exc:
        return [str(exc)]
    problems = []
    if info.recipe != job.recipe.name:
        problems.append(f"S_{index} was trained by recipe {info.recipe!r}, the spec says {job.recipe.name!r}")
    if info.config != job.config:
        problems.append(f"S_{index} records another config than the spec's")
    if info.seed != job.seed:
        problems.append(f"S_{index} records seed {info.seed}, the spec's is {job.seed} (another job's state?)")
    if info.step != index * job.k:
        problems.append(f"S_{index} is at step {info.step}, not at its boundary {index * job.k}")
    if _layout(state.weights) != _layout(job.initial.weights):
        problems.append(f"S_{index}'s weights are not the tensors (names, dtypes, shapes) of the spec's model")
    if index == 0 and not problems:
        problems += _initial_state_problems(state, job)
    return problems


def _layout(weights: Mapping[str, torch.Tensor]) -> dict[str, tuple]:
    return {name: (t.dtype, tuple(t.shape)) for name, t in weights.items()}


def _initial_state_problems(state: TrainState, job: AuditedJob) -> list[str]:
    """S_0 must be the state the broker builds itself from the spec (W0 is never the executor's choice)."""
    problems = []
    if state_sha256(state.weights) != state_sha256(job.initial.weights):
        problems.append("S_0's weights are not the W0 the spec's recipe and seed produce")
    if state_sha256(state.rest) != state_sha256(job.initial.rest):
        problems.append("S_0's optimizer, data or environment state is not the one the spec produces")
    return problems


def _replay(job: AuditedJob, opening: CheckedOpening) -> ReplayResult:
    """Re-execute segment i from the executor's S_i, following its recorded decisions."""
    return replay_state(job.recipe, opening.state, job.k, opening.trace, job.config)


def _compare_weights(evidence: SegmentEvidence, opening: CheckedOpening, replay: ReplayResult, limits: Thresholds) -> None:
    try:
        distance = weight_distance(opening.state.weights, replay.weights, opening.next_weights)
    except VerificationError as exc:
        evidence.reject(exc.reason)
        return
    evidence.r, evidence.divergence, evidence.update_norm = distance.r, distance.divergence, distance.update
    evidence.relative_update = distance.relative_update
    if limits.exact:
        if replay.weights_sha256 != opening.hashes.next_weights_sha256:
            evidence.reject(f"a trusted deterministic executor must reproduce S_{opening.index + 1} exactly; r = {distance.r:.3g}")
        return
    if distance.r > limits.tau:
        evidence.reject(f"r = {distance.r:.3g} exceeds τ = {limits.tau:.3g}: the committed S_{opening.index + 1} is not what these k steps produce")
    if distance.update == 0:
        return  # no update is scheduled in this segment (e.g. before learning starts); r demanded equality
    evidence.update_per_lr = update_per_lr(distance, replay.state.rest)
    if limits.update_floor is not None and evidence.update_per_lr < limits.update_floor:
        evidence.reject(
            f"the re-executed update is implausibly small ({evidence.update_per_lr:.3g} per unit lr, "
            f"calibrated floor {limits.update_floor:.3g}): a manipulated optimizer state?"
        )


def _check_decisions(evidence: SegmentEvidence, replay: ReplayResult, limits: Thresholds) -> None:
    decisions = DecisionEvidence.of(replay.decisions, limits.margin_tol)
    evidence.decisions = decisions
    if limits.exact and decisions.disagreements:
        evidence.reject(f"{decisions.disagreements} recorded decisions differ from a deterministic re-execution")
    elif not decisions.passed:
        evidence.reject(
            f"{decisions.disagreements} of {decisions.compared} recorded decisions disagree with the verifier's own "
            f"values, by up to {decisions.max_margin:.3g} (tolerance {decisions.margin_tol:.3g})"
        )


def _check_exact_rest(
    evidence: SegmentEvidence, job: AuditedJob, openings: Openings, opening: CheckedOpening, replay: ReplayResult
) -> None:
    try:
        rest = open_next_state_checked(openings, opening)
    except OpeningError as exc:
        evidence.reject(exc.reason)
        return
    compared, differ = exact_mismatches(job.recipe.name, replay.state.rest, rest)
    evidence.exact_compared, evidence.exact_mismatches = compared, differ
    if differ:
        evidence.reject(
            f"S_{opening.index + 1}'s environment/data state is not what the recorded actions produce "
            f"({len(differ)} entries differ, e.g. {', '.join(differ[:3])})"
        )


@contextmanager
def _torch_threads_kept() -> Iterator[None]:
    """Re-executions pin torch's thread count to the recipe's; give the caller its own back."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)
