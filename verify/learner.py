"""The decisions part of the learner audit (docs/protocol.md §6), beyond the distance r.

The verifier re-executes the segment with the executor's decision trace forced and counts where
its own values would have chosen otherwise. Honest executors disagree only on near-ties; a
disagreement whose margin exceeds the tolerance (or any disagreement on a choice that came from the
step's own RNG, whose margin is infinite) is a lie about what was computed.

What the environment and the data pipeline produce with the decisions forced (the environment
state, the transitions appended to a buffer, counters) does not depend on floating-point weights:
the recipe's field rules mark those entries ``exact`` (:mod:`trainmaster.verify.state_rules`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from trainmaster.jobs.decisions import DecisionReport

DEFAULT_MARGIN_TOL = 1e-4
"""Largest margin an honest disagreement may have without a calibration (docs/protocol.md §6: honest ≤ 3.5e-5)."""


class DecisionEvidence(BaseModel):
    """How the forced re-execution's own decisions compared with the executor's trace."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")
    compared: int
    disagreements: int
    max_margin: float
    """The largest slack: how much the verifier's values preferred its own choice where they differed."""
    median_margin: float
    by_name: dict[str, int]
    margin_tol: float

    @property
    def passed(self) -> bool:
        return self.max_margin <= self.margin_tol

    @classmethod
    def of(cls, report: DecisionReport, margin_tol: float) -> DecisionEvidence:
        return cls(
            compared=report.compared,
            disagreements=report.disagreements,
            max_margin=report.max_margin,
            median_margin=report.median_margin,
            by_name=dict(report.by_name),
            margin_tol=margin_tol,
        )
