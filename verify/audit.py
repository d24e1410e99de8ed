"""The replay audit: re-execute the challenged segments on trusted compute and compare.

API::

    run_audit(*, commitment, openings, segments, recipe, config, seed,
              tau=None, calibration=None, trusted_exact=False, margin_tol=None,
              device=None, calibration_note=None) -> AuditReport

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
* ``device`` — the verifier's device kind (``cpu`` or ``cuda``, :mod:`trainmaster.verify.verifier_device`):
  every recipe built here resolves its ``device`` option to it (``jobs.devices.replaying_on``), so a
  state committed on a GPU is re-executed on this machine's CPU by the same recipe code. None: the
  recipe's own choice. The report says which device replayed, the executor's (from the signed
  commitment) and the pair of the calibration used (``calibration_note`` when it stands in for another).

Per challenged segment i (docs/protocol.md §4, §6; docs/audit.md):

1. open S_i, trace_i, W_{i+1} and sha256(rest_{i+1}), each no larger than the job's layout allows;
   check them against the root;
2. S_i must be of this job (recipe, config, seed, step i·k), and S_0 must be the broker's own S_0;
3. re-execute k steps from S_i here (:func:`trainmaster.jobs.replay.replay_state`, the in-memory
   half of :func:`trainmaster.jobs.replay.replay_segment`) with the executor's decisions forced,
   counting disagreements and their margins. The trainer is built from the spec, and S_i must be
   exactly what it holds after loading S_i: hyperparameters come from the spec, never the state;
4. ``r_i = ‖W_exec − W_re‖ / ‖W_re − W_i‖``; reject when ``r_i > τ(k)``, when the update per lr is
   outside the calibrated floor and ceiling, or when a decision margin is over the tolerance;
5. open the rest of S_{i+1} (exactly as large as the re-execution's) and compare every entry under
   the recipe's field rules (:mod:`trainmaster.verify.state_rules`); an entry no rule covers is refused.

Before re-executing, S_i's optimizer moments must be finite and within the bound honest Adam moments
obey (:mod:`trainmaster.verify.plausibility`): S_i is otherwise compared with nothing unless
segment i − 1 is challenged too.

Rejections never raise: they are reasons in the report, and whatever the executor's bytes make the
parser or the recipe's loading code raise is a rejection too. Exceptions are for a caller's mistake
(ValueError) and for an audit that cannot run (:class:`UncalibratedError`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch

from trainmaster.jobs.canonical import state_sha256
from trainmaster.jobs.commitment import Commitment
from trainmaster.jobs.decisions import DecisionTraceError
from trainmaster.jobs.devices import cuda_available, replaying_on
from trainmaster.jobs.execution import StateError, build_trainer, full_state, state_info
from trainmaster.jobs.recipe import FieldRule, Recipe, RecipeConfig
from trainmaster.jobs.replay import ReplayResult, replay_state
from trainmaster.jobs.state import TrainState

from .calibration import Calibration, UncalibratedError, job_class
from .distance import weight_distance
from .errors import VerificationError
from .evidence import AuditReport, FieldEvidence, InitialStateEvidence, SegmentEvidence, SegmentHashes
from .initial_state import expected_initial
from .learner import DEFAULT_MARGIN_TOL, DecisionEvidence
from .openings import (
    CheckedOpening,
    OpeningError,
    OpeningLimits,
    Openings,
    canonical_size,
    open_checked,
    open_next_state_checked,
)
from .plausibility import PARAM_GROUPS, implausible_moments
from .recipe_run import RecipeRun
from .state_rules import REPORTED_TOLERANCE, compare_rest, non_finite_entries
from .update_norm import update_per_lr


@dataclass(frozen=True)
class Thresholds:
    tau: float
    source: str
    margin_tol: float
    update_floor: float | None
    exact: bool
    field_tolerances: Mapping[str, float] | None = None
    """Per ``tolerance``/``close`` pattern, from the calibration; None: τ bounds every group (explicit τ)."""
    update_ceiling: float | None = None

    def field_tolerance(self, pattern: str, rule: FieldRule) -> float:
        if self.exact:
            return 0.0
        if rule == "reported":
            return REPORTED_TOLERANCE
        if self.field_tolerances is None:
            return self.tau
        if pattern not in self.field_tolerances:
            raise UncalibratedError(
                f"the calibration has no tolerance for the state entries {pattern!r}: recalibrate the job class"
            )
        return self.field_tolerances[pattern]


@dataclass(frozen=True)
class InitialState:
    """What the audit keeps of S_0, the state the broker builds from the spec: not its tensors, which
    would sit on top of every segment's for the whole audit (a model's weights once more)."""

    layout: dict[str, tuple]
    """The names, dtypes and shapes of W0: every S_i's weights must have them."""
    weights_sha256: str
    rest_sha256: str
    """An opened S_0 must hash to these."""
    param_groups: dict[str, torch.Tensor]
    """Every optimizer's ``…/param_groups.json`` (the spec's betas, for the moment bound)."""

    @classmethod
    def of(cls, state: TrainState) -> InitialState:
        return cls(
            layout=_layout(state.weights),
            weights_sha256=state_sha256(state.weights),
            rest_sha256=state_sha256(state.rest),
            param_groups={name: t for name, t in state.rest.items() if name.endswith("/" + PARAM_GROUPS)},
        )


@dataclass(frozen=True)
class AuditedJob(RecipeRun):
    """The recipe run the spec fixes (recipe, config in JSON form, job seed, k), and so S_0."""

    initial: InitialState
    """S_0 as the broker builds it from the spec (its hashes and layout)."""
    limits: OpeningLimits
    """How large each opened file may be, from S_0's layout."""
    boundary_spec: Any = None
    """What the sampled tier's checks compare against (verify/boundaries.py ``Spec``), from S_0."""


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
    device: str | None = None,
    calibration_note: str | None = None,
    boundary_chunks: int | None = None,
    recipe_target: str | None = None,
) -> AuditReport:
    """Audit the challenged ``segments`` of a committed run (see the module docstring). With
    ``boundary_chunks`` (the sampled tier), every boundary is also spot-checked (verify/boundaries.py).
    ``recipe_target``: a job's own recipe as ``module:attr``, for rebuilding S_0 with another CPU kernel set in a
    child process (verify/initial_state.py); a shipped recipe is found by its name."""
    indices = sorted(set(segments))
    if not indices:
        raise ValueError("no segments to audit")
    if indices[0] < 0 or indices[-1] >= commitment.n:
        raise ValueError(f"challenged segments {indices} are outside 0..{commitment.n - 1}")
    with _torch_threads_kept(), replaying_on(device):
        job = _job(recipe, config, seed, commitment.k)
        limits = _thresholds(job, tau=tau, calibration=calibration, trusted_exact=trusted_exact, margin_tol=margin_tol)
        initial = _expected_initial(job, commitment, recipe, recipe_target, device) if indices[0] == 0 else None
        evidence = [_audit_segment(i, job, commitment, openings, limits, initial) for i in indices]
        boundaries = None if boundary_chunks is None else _boundaries(job, commitment, openings, indices, boundary_chunks)
    reasons = [f"segment {e.index}: {reason}" for e in evidence for reason in e.reasons]
    passed = all(e.passed for e in evidence) and (boundaries is None or boundaries.passed)
    cannot_judge = None
    if passed and initial is not None and initial.matched is None:  # never a silent accept of an unjudged S_0
        passed, cannot_judge = False, initial.reason or "S_0 was not judged"
        reasons.append("segment 0: " + cannot_judge)
    return AuditReport(
        tier="replay" if boundaries is None else "sampled",
        boundaries=boundaries,
        device=device or ("cuda" if cuda_available() else "cpu"),
        executor_device=commitment.device_kind,
        calibration_pair=calibration.pair if calibration is not None and limits.source == "calibration" else None,
        calibration_note=calibration_note,
        passed=passed,
        cannot_judge=cannot_judge,
        initial_state=initial,
        reasons=reasons + (["boundary checks: " + r for r in boundaries.reasons] if boundaries is not None else []),
        recipe=job.recipe.name,
        k=job.k,
        tau=limits.tau,
        tau_source=limits.source,
        margin_tol=limits.margin_tol,
        update_floor=limits.update_floor,
        segments=evidence,
        replay_seconds=sum(e.replay_seconds for e in evidence),
    )


def _boundaries(job: AuditedJob, commitment: Commitment, openings: Openings, segments: Sequence[int], c: int):
    """The sampled tier's checks of every boundary: from the executor's ``chunks/`` openings, or, when the
    openings folder holds every state (a run's own checkpoints), built from those files here — each chunk is
    tied to the root either way."""
    import tempfile
    from pathlib import Path

    from trainmaster.jobs.boundary_chunks import CHUNKS_DIR, write_openings

    from .boundaries import BoundaryReport, check_boundaries

    directory = getattr(openings, "checkpoint_dir", None)
    if directory is None:
        return BoundaryReport(passed=False, reasons=["the openings come from no folder the boundary chunks can be read from"],
                              boundaries=0, chunks=0, bytes_opened=0, per_boundary={}, measurements=[])
    directory = Path(directory)
    if (directory / CHUNKS_DIR).is_dir():
        return check_boundaries(commitment, directory, segments, job.boundary_spec, c)
    with tempfile.TemporaryDirectory(prefix="trainmaster-chunks-") as scratch:
        try:
            write_openings(directory, segments, Path(scratch), c)
        except (OSError, ValueError, KeyError) as exc:
            return BoundaryReport(passed=False, reasons=[f"the boundaries cannot be opened: {exc}"], boundaries=0,
                                  chunks=0, bytes_opened=0, per_boundary={}, measurements=[])
        return check_boundaries(commitment, Path(scratch), segments, job.boundary_spec, c)


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
        point.tau,
        "calibration",
        margin_tol if margin_tol is not None else point.margin_tol,
        point.update_floor,
        False,
        point.field_tolerance,
        point.update_ceiling,
    )


def _job(recipe: str | Recipe, config: Mapping[str, Any] | RecipeConfig, seed: int, k: int) -> AuditedJob:
    from trainmaster.jobs.recipes import get_recipe

    resolved = recipe if isinstance(recipe, Recipe) else get_recipe(recipe)
    cfg = resolved.config(config.model_dump(mode="json") if isinstance(config, RecipeConfig) else dict(config))
    initial = full_state(build_trainer(resolved, cfg, seed), resolved, cfg, seed, 0)
    limits = OpeningLimits.for_job(resolved, cfg, initial, k)
    from .boundaries import spec_of

    run = RecipeRun(resolved, cfg.model_dump(mode="json"), seed, k)
    return AuditedJob(resolved, run.config, seed, k, InitialState.of(initial), limits,
                      spec_of(run, initial, limits.rest_bytes))


def _expected_initial(job: AuditedJob, commitment: Commitment, recipe: str | Recipe, target: str | None,
                      device: str | None) -> InitialStateEvidence:
    """The S_0 the executor's must equal: the spec's with the CPU kernel set its commitment names."""
    from trainmaster.jobs.recipes import MODULES, get_recipe

    if target is None and job.recipe.name in MODULES and (isinstance(recipe, str) or get_recipe(job.recipe.name) is recipe):
        target = job.recipe.name  # a shipped recipe: the child finds it by its name
    return expected_initial(commitment, weights_sha256=job.initial.weights_sha256, rest_sha256=job.initial.rest_sha256,
                            recipe=target, config=job.config, seed=job.seed, device=device)


def _audit_segment(
    index: int, job: AuditedJob, commitment: Commitment, openings: Openings, limits: Thresholds,
    initial: InitialStateEvidence | None = None,
) -> SegmentEvidence:
    evidence = SegmentEvidence(
        index=index, tau=limits.tau, update_floor=limits.update_floor, update_ceiling=limits.update_ceiling
    )
    try:
        opening = open_checked(openings, commitment, index, job.limits)
    except OpeningError as exc:
        if exc.hashes is not None:
            evidence.hashes = SegmentHashes.of(exc.hashes)
        return evidence.reject(exc.reason)
    evidence.hashes = SegmentHashes.of(opening.hashes)
    if problems := _identity_problems(opening.state, job, index, initial):
        return evidence.reject(*problems)
    if bad := non_finite_entries(job.recipe.rules, opening.state.rest):
        return evidence.reject(f"S_{index} holds NaN or Inf in {', '.join(bad[:3])}")
    if implausible := implausible_moments(opening.state.rest, job.initial.param_groups):
        return evidence.reject(f"S_{index} cannot come from honest training: " + "; ".join(implausible[:3]))
    started = time.perf_counter()
    try:
        replay = _replay(job, opening)
    except (StateError, DecisionTraceError) as exc:
        return evidence.reject(f"S_{index} and its trace cannot be re-executed as committed: {exc}")
    except Exception as exc:  # S_i is executor data: whatever it makes the recipe's own code raise, it is refused
        return evidence.reject(f"S_{index} cannot be loaded and re-executed ({type(exc).__name__}: {exc})")
    finally:
        evidence.replay_seconds = time.perf_counter() - started
    evidence.hashes.replay_weights_sha256 = replay.weights_sha256
    _compare_weights(evidence, opening, replay, limits)
    _check_decisions(evidence, replay, limits)
    # The weights are compared: S_i's, S_{i+1}'s and the re-executed ones go before the rest of S_{i+1} is opened.
    opening = replace(opening, state=TrainState(rest=opening.state.rest), next_weights={})
    replay = replace(replay, state=TrainState(rest=replay.state.rest))
    _check_rest(evidence, job, openings, opening, replay, limits)
    return evidence


def _identity_problems(state: TrainState, job: AuditedJob, index: int,
                       initial: InitialStateEvidence | None = None) -> list[str]:
    """Whether S_i belongs to this job at this point (a replayed result from another job fails here)."""
    try:
        info = state_info(state)
    except StateError as exc:
        return [f"S_{index}: {exc}"]
    except Exception as exc:  # noqa: BLE001 — the runtime's entries are executor data: unreadable is refused
        return [f"S_{index}'s runtime entries cannot be read ({type(exc).__name__}: {exc})"]
    problems = []
    if info.recipe != job.recipe.name:
        problems.append(f"S_{index} was trained by recipe {info.recipe!r}, the spec says {job.recipe.name!r}")
    if info.config != job.config:
        problems.append(f"S_{index} records another config than the spec's")
    if info.seed != job.seed:
        problems.append(f"S_{index} records seed {info.seed}, the spec's is {job.seed} (another job's state?)")
    if info.step != index * job.k:
        problems.append(f"S_{index} is at step {info.step}, not at its boundary {index * job.k}")
    if _layout(state.weights) != job.initial.layout:
        problems.append(f"S_{index}'s weights are not the tensors (names, dtypes, shapes) of the spec's model")
    if index == 0 and not problems:
        problems += _initial_state_problems(state, job, initial)
    return problems


def _layout(weights: Mapping[str, torch.Tensor]) -> dict[str, tuple]:
    return {name: (t.dtype, tuple(t.shape)) for name, t in weights.items()}


def _initial_state_problems(state: TrainState, job: AuditedJob, initial: InitialStateEvidence | None = None) -> list[str]:
    """S_0 must be the state the broker builds itself from the spec (W0 is never the executor's choice): with the CPU
    kernel set the executor's commitment names (``initial``, verify/initial_state.py; None: the audit's own S_0).
    An S_0 that kernel set cannot be rebuilt with here is not judged (``initial.matched`` stays None)."""
    if initial is not None and initial.weights_sha256 is None:
        return []
    weights = initial.weights_sha256 if initial is not None else job.initial.weights_sha256
    rest = initial.rest_sha256 if initial is not None else job.initial.rest_sha256
    named = f" with the CPU kernel set {initial.kernels}" if initial is not None and initial.kernels else ""
    problems = []
    if state_sha256(state.weights) != weights:
        problems.append(f"S_0's weights are not the W0 the spec's recipe and seed produce{named}")
    if state_sha256(state.rest) != rest:
        problems.append(f"S_0's optimizer, data or environment state is not the one the spec produces{named}")
    if initial is not None:
        initial.matched = not problems
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
    if not distance.r <= limits.tau:  # NaN (a state that blows the re-execution up) rejects too
        evidence.reject(f"r = {distance.r:.3g} exceeds τ = {limits.tau:.3g}: the committed S_{opening.index + 1} is not what these k steps produce")
    if distance.update == 0:
        return  # no update is scheduled in this segment (e.g. before learning starts); r demanded equality
    evidence.update_per_lr = update_per_lr(distance, replay)
    if limits.update_floor is not None and evidence.update_per_lr < limits.update_floor:
        evidence.reject(
            f"the re-executed update is implausibly small ({evidence.update_per_lr:.3g} per unit lr, "
            f"calibrated floor {limits.update_floor:.3g}): a manipulated optimizer state?"
        )
    if limits.update_ceiling is not None and not evidence.update_per_lr <= limits.update_ceiling:
        evidence.reject(
            f"the re-executed update is implausibly large ({evidence.update_per_lr:.3g} per unit lr, "
            f"calibrated ceiling {limits.update_ceiling:.3g}): optimizer moments crafted to move the weights?"
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


def _check_rest(
    evidence: SegmentEvidence,
    job: AuditedJob,
    openings: Openings,
    opening: CheckedOpening,
    replay: ReplayResult,
    limits: Thresholds,
) -> None:
    """Open the rest of S_{i+1} and compare every entry with the re-execution's under the recipe's rules."""
    following = opening.index + 1
    try:
        rest = open_next_state_checked(
            openings, opening, max_rest_bytes=canonical_size(replay.state.rest), max_trace_bytes=job.limits.trace_bytes
        )
    except OpeningError as exc:
        evidence.reject(exc.reason)
        return
    found = compare_rest(job.recipe.rules, opening.state.rest, replay.state.rest, rest)
    evidence.exact_compared, evidence.exact_mismatches = found.compared, found.exact_mismatches
    if found.problems:
        evidence.reject(f"S_{following} is refused: " + "; ".join(found.problems[:3]))
    if found.exact_mismatches:
        evidence.reject(
            f"S_{following} is not what these k steps produce in {len(found.exact_mismatches)} entries compared "
            f"exactly: " + "; ".join(found.differences)
        )
    for pattern, group in found.groups.items():
        tolerance = limits.field_tolerance(pattern, group.rule)
        evidence.fields[pattern] = FieldEvidence(rule=group.rule, r=group.r, tolerance=tolerance, worst=group.worst)
        if not group.r <= tolerance:
            evidence.reject(
                f"S_{following}'s {pattern} is not what these k steps produce: r = {group.r:.3g} exceeds its "
                f"tolerance {tolerance:.3g} (most in {group.worst})"
            )


@contextmanager
def _torch_threads_kept() -> Iterator[None]:
    """Re-executions pin torch's thread count to the recipe's; give the caller its own back."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)
