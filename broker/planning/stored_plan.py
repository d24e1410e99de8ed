"""The plan a job keeps: chosen at submit, used at dispatch, remade after a failed attempt, and quoted
again (`requote`) when its offer's quote expired before dispatch.

Storing it (with the policy snapshot on the job) means a job is dispatched on exactly the offer,
expected cost and policy the user saw when it was submitted: no second round of offers while its
quote holds, and no change of mind because a policy file was edited while the job ran.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from trainmaster.backends.base import Offer

CONSIDERED_KEPT = 20  # rows of the considered-offers table kept with the plan


class StoredPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: int
    """1 for the plan made at submit, +1 for each re-plan after a failed attempt."""
    offer: Offer
    hours: float
    expected_micro_usd: int
    basis: str
    offers: int
    considered: list[tuple[str, str]]

    @classmethod
    def of(cls, plan, seq: int) -> StoredPlan:
        chosen = plan.chosen
        return cls(seq=seq, offer=plan.quoted(chosen.offer), hours=chosen.hours, expected_micro_usd=chosen.expected_micro_usd,
                   basis=plan.basis, offers=len(plan.rows),
                   considered=[(r.offer.key, r.verdict) for r in plan.rows[:CONSIDERED_KEPT]])

    def event(self) -> dict:
        """What the `planned` event row records (what `trainmaster status` shows)."""
        return {"chosen": self.offer.key, "expected_micro_usd": self.expected_micro_usd, "hours": self.hours,
                "considered": [list(c) for c in self.considered], "offers": self.offers, "seq": self.seq,
                "valid_until": self.offer.valid_until, "quote": self.offer.quote}


def requote(stored: StoredPlan, fresh) -> StoredPlan | None:
    """What to dispatch after `fresh` (a Plan) quoted the stored plan's expired offer again: the same offer
    key at an expected cost within the plan's, else `fresh`'s own choice (a new plan), else None."""
    same = next((r for r in fresh.rows[:fresh.ranked] if r.offer.key == stored.offer.key), None)
    if same is not None and same.expected_micro_usd <= stored.expected_micro_usd:
        return stored.model_copy(update={"offer": fresh.quoted(same.offer), "hours": same.hours,
                                         "expected_micro_usd": same.expected_micro_usd})
    return StoredPlan.of(fresh, stored.seq + 1) if fresh.chosen is not None else None
