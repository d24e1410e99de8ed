"""What a replay audit found, per challenged segment and overall (stored with the verdict)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .learner import DecisionEvidence
from .boundary_evidence import BoundaryReport
from .openings import OpeningHashes


class SegmentHashes(BaseModel):
    """The committed hashes of the opening (checked against the root) and of the verifier's S_{i+1}."""

    leaf: str
    next_leaf: str
    weights_sha256: str
    rest_sha256: str = Field(description="sha256(rest_i ‖ trace_i), as committed")
    next_weights_sha256: str
    next_rest_sha256: str
    replay_weights_sha256: str | None = Field(None, description="the verifier's own weights of S_{i+1}")

    @classmethod
    def of(cls, hashes: OpeningHashes) -> SegmentHashes:
        return cls(
            leaf=hashes.leaf,
            next_leaf=hashes.next_leaf,
            weights_sha256=hashes.weights_sha256,
            rest_sha256=hashes.rest_sha256,
            next_weights_sha256=hashes.next_weights_sha256,
            next_rest_sha256=hashes.next_rest_sha256,
        )


class FieldEvidence(BaseModel):
    """One group of S_{i+1}'s rest entries compared within a tolerance (``verify.state_rules``)."""

    model_config = ConfigDict(ser_json_inf_nan="strings")
    rule: Literal["tolerance", "close", "reported"]
    r: float = Field(description="tolerance: ‖X_exec − X_re‖ / ‖X_re − X_i‖; close: ‖X_exec − X_re‖ / ‖X_re‖")
    tolerance: float
    worst: str = Field(description="the entry that diverges most")


class SegmentEvidence(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="strings")
    index: int
    passed: bool = True
    reasons: list[str] = Field(default_factory=list)
    tau: float
    r: float | None = Field(None, description="‖W_exec − W_re‖ / ‖W_re − W_i‖")
    divergence: float | None = Field(None, description="‖W_exec − W_re‖")
    update_norm: float | None = Field(None, description="‖W_re − W_i‖")
    relative_update: float | None = Field(None, description="‖W_re − W_i‖ / ‖W_i‖")
    update_per_lr: float | None = Field(None, description="relative update per unit of the largest lr the re-execution stepped with")
    update_floor: float | None = Field(None, description="update_per_lr below this rejects (from the calibration)")
    update_ceiling: float | None = Field(None, description="update_per_lr above this rejects (from the calibration)")
    hashes: SegmentHashes | None = None
    decisions: DecisionEvidence | None = None
    exact_compared: int | None = Field(None, description="rest entries of S_{i+1} compared under the recipe's rules")
    exact_mismatches: list[str] = Field(default_factory=list, description="entries of rule 'exact' that differ")
    fields: dict[str, FieldEvidence] = Field(default_factory=dict, description="per pattern of rule 'tolerance', 'close' or 'reported'")
    replay_seconds: float = 0.0

    def reject(self, *reasons: str) -> SegmentEvidence:
        self.passed = False
        self.reasons.extend(reasons)
        return self


class InitialStateEvidence(BaseModel):
    """Which S_0 the executor's opened S_0 was compared with (verify/initial_state.py): the one the spec's recipe and
    seed produce with the CPU kernel set the signed commitment names."""

    kernels: str | None = Field(description="the CPU kernel set the executor's commitment names (None: none, a GPU run)")
    verifier_kernels: str = Field(description="the kernel set this verifier's process computes with")
    rebuilt: Literal["here", "child"] = Field(description="here: the audit's own S_0; child: rebuilt by a process "
                                              "running the executor's kernel set")
    weights_sha256: str | None = None
    rest_sha256: str | None = None
    matched: bool | None = Field(None, description="S_0 equals it bit for bit; None: not judged (see reason)")
    reason: str | None = Field(None, description="why S_0 is not judged here")

    def not_judged(self, reason: str) -> InitialStateEvidence:
        return self.model_copy(update={"matched": None, "reason": reason})


class AuditReport(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="strings")
    passed: bool
    tier: Literal["replay", "sampled"] = Field("replay", description="replay: the challenged segments alone; "
                                                "sampled: also chunks of every boundary")
    boundaries: BoundaryReport | None = Field(None, description="the sampled tier's boundary checks")
    reasons: list[str] = Field(description="every segment's reasons, prefixed with its index")
    recipe: str
    k: int
    tau: float
    tau_source: Literal["calibration", "explicit", "exact"]
    margin_tol: float
    update_floor: float | None
    segments: list[SegmentEvidence]
    replay_seconds: float = Field(description="wall time of the re-executions")
    device: str = Field("cpu", description="the device kind the segments were re-executed on (recipe: its own choice)")
    executor_device: str = Field("cpu", description="the device kind the executor trained on (its signed commitment)")
    calibration_pair: str | None = Field(None, description="executor→verifier pair of the calibration that set τ")
    calibration_note: str | None = Field(None, description="why that pair's calibration applies to another pair")
    initial_state: InitialStateEvidence | None = Field(None, description="what S_0 was compared with, across kernel sets")
    cannot_judge: str | None = Field(None, description="every check passed but S_0 could not be judged here (not "
                                     "passed: the verification cannot be completed on this machine)")
