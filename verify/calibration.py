"""The calibration artifact of a job class: the measured r distributions and the thresholds derived from them.

Produced by :mod:`trainmaster.verify.calibrate`, stored as ``<directory>/<job class>.json`` for the
(executor, verifier) device pair cpu→cpu and ``<directory>/<job class>.<executor>-<verifier>.json``
for the others (cuda→cpu, cuda→cuda; the broker passes ``$TRAINMASTER_HOME/calibration``), read by
every audit of that class and pair. The shipped recipes at their shipped configs come with
calibrations of their own (package data, ``verify/calibrations/``: cpu→cpu, and cuda→cpu and cuda→cuda
measured on an NVIDIA H200 by ``./dev gpu-check``), used when the directory has none. A cuda→cpu audit
of a class without a cuda→cpu calibration uses the class's cpu→cpu one, which stands in for it
(:func:`calibration_for_pair`; the evidence and the choice: docs/audit.md, "Devices"). Per segment
length k (docs/protocol.md §5)::

    p99_honest = 99th percentile of r over every honest variant and base state
    r_min_cheat = smallest r of the mildest cheat (lr × 0.9)
    R(k)   = r_min_cheat / p99_honest                 separation; want ≥ 10
    τ(k)   = sqrt(p99_honest · r_min_cheat)           a margin of sqrt(R) on both sides

plus the learner audit's decision-margin tolerance, the update-norm floor and ceiling, and a
tolerance per group of state entries. Format: docs/audit.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainmaster.jobs.files import write_bytes_atomic

from .errors import VerificationError
from .learner import DEFAULT_MARGIN_TOL

FORMAT = "trainmaster-calibration-v1"
HOME_ENV = "TRAINMASTER_HOME"  # as the broker reads it (verify may not import the broker)
SHIPPED = "calibrations"
DeviceKind = Literal["cpu", "cuda"]
SEPARATION_TARGET = 10.0
"""R(k) below this leaves less than a 3.2× margin on either side of τ: warn, suggest a smaller k."""
P99_FLOOR = 1e-12
"""Honest r measured as exactly 0 everywhere still leaves τ > 0 (other hardware is never bit-exact)."""
MARGIN_FACTOR = 10.0
"""The decision-margin tolerance is this many times the largest honest margin (at least the default)."""
UPDATE_FLOOR_FACTOR = 1e-3
"""An update per unit lr below this fraction of the smallest honest one is implausible (gross manipulation only)."""
UPDATE_CEILING_FACTOR = 10.0
"""An update per unit lr above this multiple of the largest honest one is implausible: Adam moves each
weight by at most about lr · C(β) a step (verify/plausibility.py), and the calibration's bases span
the whole run, the large first updates after learning starts included."""
FIELD_FACTOR = 10.0
"""A rest-entry group (optimizer moments, target network, priorities) may diverge this many times its
largest honest divergence over every base and variant, as much as the geometric mean of that and
the mildest cheat's smallest divergence in the group (τ's construction, per group), as much as the
weights (τ), and at least :data:`FIELD_FLOOR`."""
FIELD_FLOOR = 0.01
"""No group's tolerance is below 1 % of the segment's own change in it. Honest moments of RL recipes
have far heavier tails than the weights: a ReLU that flips under another reduction order changes one
sample's share of a gradient, and on DQN ``exp_avg`` and ``exp_avg_sq`` reached 14× and 50× the
largest of 36 calibrated values in 2 of 700 audits (r up to 1.6e-3). What a group exists to catch
gives r ≳ 0.7 (zeroed, negated or inflated moments, a zeroed target network, rigged priorities or
rollout values), and 1 % of a segment's change in a moment moves no update measurably."""


class UncalibratedError(VerificationError):
    """No usable calibration for this job class and k, and no explicit τ: the audit cannot run."""

    def __init__(self, reason: str):
        super().__init__(reason, kind="cannot_verify")


class CalibrationPoint(BaseModel):
    """Everything measured and derived for one segment length k."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    k: int = Field(ge=1)
    honest_r: dict[str, list[float]] = Field(description="r of each honest variant, one value per base state")
    cheat_r: dict[str, list[float]] = Field(description="r of the mildest cheat, one value per base state")
    honest_p99: float
    cheat_min: float
    separation: float = Field(description="R(k) = cheat_min / honest_p99")
    tau: float = Field(description="τ(k) = sqrt(honest_p99 · cheat_min)")
    honest_max_margin: float = Field(description="largest decision margin of an honest disagreement")
    margin_tol: float = Field(description="decision margins above this reject")
    min_update_per_lr: float = Field(description="smallest honest ‖W_re − W_i‖ / (‖W_i‖ · lr)")
    update_floor: float = Field(description="updates per lr below this reject")
    max_update_per_lr: float | None = Field(None, description="largest honest ‖W_re − W_i‖ / (‖W_i‖ · lr)")
    update_ceiling: float | None = Field(None, description="updates per lr above this reject (None: not calibrated)")
    honest_fields: dict[str, list[float]] = Field(
        default_factory=dict, description="per rest-entry pattern of rule tolerance/close: every honest variant's r"
    )
    cheat_fields: dict[str, list[float]] = Field(
        default_factory=dict, description="per rest-entry pattern of rule tolerance/close: the mildest cheat's r"
    )
    field_tolerance: dict[str, float] = Field(
        default_factory=dict,
        description="per pattern: the largest r an audit accepts (FIELD_FACTOR × honest maximum, or sqrt(honest maximum × "
        "cheat minimum), at least τ)",
    )

    @classmethod
    def from_measurements(
        cls,
        k: int,
        honest_r: Mapping[str, Sequence[float]],
        cheat_r: Mapping[str, Sequence[float]],
        honest_margins: Sequence[float],
        updates_per_lr: Sequence[float],
        honest_fields: Mapping[str, Sequence[float]] | None = None,
        cheat_fields: Mapping[str, Sequence[float]] | None = None,
    ) -> CalibrationPoint:
        honest = [r for values in honest_r.values() for r in values]
        cheats = [r for values in cheat_r.values() for r in values]
        if not honest or not cheats or not updates_per_lr:
            raise ValueError(f"k = {k}: nothing was measured")
        if not all(math.isfinite(r) for r in honest):
            raise ValueError(f"k = {k}: an honest variant gave r = inf (it changed weights a segment did not update)")
        max_margin = max(honest_margins, default=0.0)
        if not math.isfinite(max_margin):
            raise ValueError(f"k = {k}: honest executors disagreed on a choice drawn from the step's RNG")
        p99 = max(float(np.percentile(honest, 99)), P99_FLOOR)
        cheat_min = min(cheats)
        min_update = min(updates_per_lr)
        fields = {pattern: list(values) for pattern, values in (honest_fields or {}).items()}
        cheat_fields = {pattern: list(values) for pattern, values in (cheat_fields or {}).items()}
        if any(not math.isfinite(r) for values in fields.values() for r in values):
            raise ValueError(f"k = {k}: an honest variant's state entries diverged infinitely from the re-execution")
        return cls(
            k=k,
            honest_r={name: list(values) for name, values in honest_r.items()},
            cheat_r={name: list(values) for name, values in cheat_r.items()},
            honest_p99=p99,
            cheat_min=cheat_min,
            separation=cheat_min / p99,
            tau=math.sqrt(p99 * cheat_min),
            honest_max_margin=max_margin,
            margin_tol=max(DEFAULT_MARGIN_TOL, MARGIN_FACTOR * max_margin),
            min_update_per_lr=min_update,
            update_floor=UPDATE_FLOOR_FACTOR * min_update,
            max_update_per_lr=max(updates_per_lr),
            update_ceiling=UPDATE_CEILING_FACTOR * max(updates_per_lr),
            honest_fields=fields,
            cheat_fields=cheat_fields,
            field_tolerance={
                pattern: _field_tolerance(values, cheat_fields.get(pattern, []), math.sqrt(p99 * cheat_min))
                for pattern, values in fields.items()
            },
        )


def _field_tolerance(honest: Sequence[float], cheat: Sequence[float], tau: float) -> float:
    """See :data:`FIELD_FACTOR`; a cheat divergence that is not finite, or none, adds nothing."""
    honest_max = max(max(honest), P99_FLOOR)
    finite = [r for r in cheat if math.isfinite(r)]
    between = math.sqrt(honest_max * min(finite)) if finite else 0.0
    return max(FIELD_FACTOR * honest_max, between, tau, FIELD_FLOOR)


class Base(BaseModel):
    """A state segments were re-executed from: the job seed and the step it was taken at."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    seed: int
    step: int


class Calibration(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    format: Literal["trainmaster-calibration-v1"] = FORMAT
    job_class: str
    executor: DeviceKind = Field("cpu", description="the device kind the executor variants trained on")
    verifier: DeviceKind = Field("cpu", description="the device kind the re-executions ran on")
    recipe: str
    config: dict[str, Any]
    bases: list[Base]
    created: str = Field(description="ISO 8601 UTC time of the measurement")
    environment: dict[str, str] = Field(
        description="where it was measured: torch, python, platform, threads; for a GPU its name, capability, CUDA and "
        "cuDNN versions (executor_* and verifier_* for each side)"
    )
    points: list[CalibrationPoint]

    def point(self, k: int) -> CalibrationPoint:
        """The measurements for segment length ``k``; :class:`UncalibratedError` if k was not calibrated."""
        for point in self.points:
            if point.k == k:
                return point
        measured = ", ".join(str(p.k) for p in self.points) or "none"
        raise UncalibratedError(f"job class {self.job_class} is not calibrated for k = {k} (calibrated: {measured})")

    def tau(self, k: int) -> float:
        return self.point(k).tau

    @property
    def pair(self) -> str:
        """``executor→verifier``, e.g. ``cuda→cpu``."""
        return pair_name(self.executor, self.verifier)

    @property
    def recommended_k(self) -> int | None:
        """The largest calibrated k whose separation reaches :data:`SEPARATION_TARGET`."""
        good = [p.k for p in self.points if p.separation >= SEPARATION_TARGET]
        return max(good, default=None)

    def warnings(self) -> list[str]:
        """One line per k whose separation is below target, with the k to use instead."""
        lines = []
        for point in self.points:
            if point.separation < SEPARATION_TARGET:
                better = self.recommended_k
                advice = f"use k = {better}" if better is not None and better < point.k else f"try k ≤ {max(1, point.k // 2)}"
                lines.append(
                    f"k = {point.k}: separation R = {point.separation:.3g} < {SEPARATION_TARGET:g} "
                    f"(honest p99 r {point.honest_p99:.3g}, mildest cheat r {point.cheat_min:.3g}); {advice}"
                )
        return lines


NOT_CLASS = ("steps", "device")
"""Config fields that do not make a job class: the run length, and where it trains (the device pair
is the calibration's own key, next to the class)."""


def job_class(recipe: str, config: Mapping[str, Any]) -> str:
    """The class a job is calibrated as: its recipe and every hyperparameter except the run length and the device.

    Any change to the model, optimizer or data settings (lr included: a tiny lr slipped into a spec
    gets no calibration) makes a new class; T does not, so retraining runs of any length share one,
    and neither does ``device`` (``auto`` and ``cuda`` compute the same; the pair keys the file).
    """
    rest = {key: value for key, value in config.items() if key not in NOT_CLASS}
    digest = hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return f"{recipe}-{digest[:12]}"


def default_calibration_dir() -> Path:
    """``$TRAINMASTER_HOME/calibration``, else ``calibration`` under the platform's user data dir."""
    home = os.environ.get(HOME_ENV)
    if home:
        return Path(home).expanduser().absolute() / "calibration"
    import platformdirs

    return Path(platformdirs.user_data_dir("trainmaster", appauthor=False)) / "calibration"


def pair_name(executor: str, verifier: str) -> str:
    return f"{executor}→{verifier}"


def calibration_path(directory: Path, job_class_name: str, executor: str = "cpu", verifier: str = "cpu") -> Path:
    """``<job class>.json`` for cpu→cpu (the name before device pairs existed), else ``<job class>.<e>-<v>.json``."""
    suffix = "" if (executor, verifier) == ("cpu", "cpu") else f".{executor}-{verifier}"
    return Path(directory) / f"{job_class_name}{suffix}.json"


def shipped_calibration_dir() -> Path:
    """The calibrations shipped with trainmaster for its recipes at their shipped configs (package data)."""
    return Path(__file__).resolve().parent / SHIPPED


def store_calibration(calibration: Calibration, directory: Path) -> Path:
    """Write ``<directory>/<job class>[.<e>-<v>].json`` atomically; return its path."""
    path = calibration_path(directory, calibration.job_class, calibration.executor, calibration.verifier)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, (calibration.model_dump_json(indent=2) + "\n").encode("utf-8"))
    return path


def load_calibration(
    directory: Path | None, job_class_name: str, executor: str = "cpu", verifier: str = "cpu"
) -> Calibration:
    """A job class's calibration for one device pair: ``directory``'s, else the shipped one; :class:`UncalibratedError`
    when neither has it, or the file is unreadable or not of that class and pair."""
    found = _find(directory, job_class_name, executor, verifier)
    if found is None:
        on = "" if (executor, verifier) == ("cpu", "cpu") else f" for {pair_name(executor, verifier)}"
        if directory is None:
            raise UncalibratedError(
                f"job class {job_class_name} is uncalibrated{on}: no calibration directory was given and none is "
                "shipped for it; run `trainmaster verify calibrate JOB.yaml`, or give τ explicitly"
            )
        raise UncalibratedError(
            f"job class {job_class_name} is not calibrated{on} (no {calibration_path(directory, job_class_name, executor, verifier)}); "
            "run `trainmaster verify calibrate JOB.yaml`"
        )
    return found


def has_calibration(directory: Path | None, job_class_name: str, executor: str, verifier: str) -> bool:
    """Whether a calibration of this class and pair exists (the directory's or a shipped one), readable or not."""
    roots = [d for d in (directory, shipped_calibration_dir()) if d is not None]
    return any(calibration_path(root, job_class_name, executor, verifier).is_file() for root in roots)


def calibration_for_pair(directory: Path | None, job_class_name: str, executor: str, verifier: str) -> Calibration:
    """The calibration an audit of this pair uses: the pair's own, else — for a GPU executor audited on a
    CPU — the class's cpu→cpu calibration standing in for cuda→cpu (its ``pair`` then says cpu→cpu).

    The stand-in is sound for fp32 recipes on the runtime's deterministic kernels: a GPU's fp32 step
    differs from a CPU's by reduction order and fused kernels, the perturbations the CPU honest variants
    emulate (another reduction order, a one-ulp nudge, a float64 executor: all on one divergence curve),
    and the divergence measured on an H200 replayed on a CPU (r ≈ 1.4–2.0e-5 at k = 25 for an 86M
    transformer) is a few hundred times inside τ; bench_cross_device.py audits the shipped recipes
    with those variants. ``trainmaster verify calibrate --executor cuda`` on a machine with a GPU
    measures the real pair, which then takes precedence.
    """
    found = _find(directory, job_class_name, executor, verifier)
    if found is None and (executor, verifier) == ("cuda", "cpu"):
        found = _find(directory, job_class_name, "cpu", "cpu")
    if found is None:
        return load_calibration(directory, job_class_name, executor, verifier)  # raises, naming the pair
    return found


def _find(directory: Path | None, job_class_name: str, executor: str, verifier: str) -> Calibration | None:
    for root in [d for d in (directory, shipped_calibration_dir()) if d is not None]:
        path = calibration_path(root, job_class_name, executor, verifier)
        try:
            calibration = Calibration.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            continue
        except (OSError, ValidationError) as exc:
            raise UncalibratedError(f"the calibration {path} is unreadable: {exc}") from exc
        if (calibration.job_class, calibration.executor, calibration.verifier) != (job_class_name, executor, verifier):
            raise UncalibratedError(
                f"the calibration {path} is of job class {calibration.job_class} for {calibration.pair}, not "
                f"{job_class_name} for {pair_name(executor, verifier)}"
            )
        return calibration
    return None
