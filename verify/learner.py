"""The parts of the learner audit (docs/protocol.md §6) beyond the distance r.

1. **Decisions.** The verifier re-executes the segment with the executor's decision trace forced and
   counts where its own values would have chosen otherwise. Honest executors disagree only on
   near-ties; a disagreement whose margin exceeds the tolerance (or any disagreement on a choice
   that came from the step's own RNG, whose margin is infinite) is a lie about what was computed.
2. **Exact state.** With the decisions forced, what the environment and the data pipeline produce
   does not depend on floating-point weights: the environment state, the transitions appended to
   the replay buffer or rollout, counters, the runtime's entries. Those parts of the executor's
   S_{i+1} must equal the verifier's bit for bit (CartPole-like physics in float64 numpy is
   bit-exact on any IEEE-754 machine).

Which rest entries are exact is a property of each recipe; :data:`EXACT_REST` lists them for the
shipped RL recipes (an entry ending in ``/`` covers everything under it).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from pydantic import BaseModel, ConfigDict

from trainmaster.jobs.decisions import DecisionReport

Tensors = Mapping[str, torch.Tensor]

DEFAULT_MARGIN_TOL = 1e-4
"""Largest margin an honest disagreement may have without a calibration (docs/protocol.md §6: honest ≤ 3.5e-5)."""

EXACT_REST: dict[str, tuple[str, ...]] = {
    "dqn": (
        "env/",
        "replay/obs",
        "replay/next_obs",
        "replay/action",
        "replay/reward",
        "replay/terminated",
        "replay/size",
        "replay/ptr",
        "runtime/",
    ),
    "ppo": (
        "env/",
        "rollout/obs",
        "rollout/action",
        "rollout/reward",
        "rollout/done",
        "rollout/size",
        "reward_scale/",
        "discounted_return",
        "global_step",
        "updates",
        "runtime/",
    ),
}


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


def has_exact_rest(recipe: str) -> bool:
    """Whether the learner audit checks part of this recipe's S_{i+1} bit for bit."""
    return recipe in EXACT_REST


def exact_names(recipe: str, names: set[str]) -> set[str]:
    """The names among ``names`` that :data:`EXACT_REST` marks exact for ``recipe``."""
    patterns = EXACT_REST.get(recipe, ())
    return {n for n in names if any(n == p or (p.endswith("/") and n.startswith(p)) for p in patterns)}


def exact_mismatches(recipe: str, replayed: Tensors, executed: Tensors) -> tuple[int, list[str]]:
    """How many exact entries were compared, and those that differ (or exist on one side only)."""
    names = exact_names(recipe, set(replayed) | set(executed))
    differ = sorted(n for n in names if n not in replayed or n not in executed or not _same(replayed[n], executed[n]))
    return len(names), differ


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN equals NaN of the same bits; -0.0 differs from 0.0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
