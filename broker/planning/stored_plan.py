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
    partner: Offer | None = None
    """The refereed tier's second miner (broker/planning/referee_pair.py): dispatched with `offer`, the two
    attempts a pair; None for every other tier."""
    partner_micro_usd: int = 0
    """The partner's expected cost (its own reservation); the pair's is `expected_micro_usd` + this."""

    @classmethod
    def of(cls, plan, seq: int) -> StoredPlan:
        chosen, partner = plan.chosen, plan.partner
        return cls(seq=seq, offer=plan.quoted(chosen.offer), hours=chosen.hours, expected_micro_usd=chosen.expected_micro_usd,
                   basis=plan.basis, offers=len(plan.rows),
                   considered=[(r.offer.key, r.verdict) for r in plan.rows[:CONSIDERED_KEPT]],
                   partner=plan.quoted(partner.offer) if partner else None,
                   partner_micro_usd=partner.expected_micro_usd if partner else 0)

    @property
    def total_micro_usd(self) -> int:
        """What the plan is expected to cost: its offer's, plus its partner's for a refereed pair."""
        return self.expected_micro_usd + self.partner_micro_usd

    def event(self) -> dict:
        """What the `planned` event row records (what `trainmaster status` shows)."""
        return {"chosen": self.offer.key, "expected_micro_usd": self.expected_micro_usd, "hours": self.hours,
                "considered": [list(c) for c in self.considered], "offers": self.offers, "seq": self.seq,
                "valid_until": self.offer.valid_until, "quote": self.offer.quote,
                **({"partner": self.partner.key, "partner_micro_usd": self.partner_micro_usd} if self.partner else {})}


def requote(stored: StoredPlan, fresh) -> StoredPlan | None:
    """What to dispatch after `fresh` (a Plan) quoted the stored plan's expired offer again: the same offer
    key at an expected cost within the plan's, else `fresh`'s own choice (a new plan), else None."""
    if stored.partner is not None:  # a refereed pair is drawn afresh: its two quotes expired together
        return StoredPlan.of(fresh, stored.seq + 1) if fresh.chosen is not None else None
    same = next((r for r in fresh.rows[:fresh.ranked] if r.offer.key == stored.offer.key), None)
    if same is not None and same.expected_micro_usd <= stored.expected_micro_usd:
        return stored.model_copy(update={"offer": fresh.quoted(same.offer), "hours": same.hours,
                                         "expected_micro_usd": same.expected_micro_usd})
    return StoredPlan.of(fresh, stored.seq + 1) if fresh.chosen is not None else None
