"""The planner: gathers offers from the backends a policy allows, filters them, and picks one.

Every offer it saw ends in the plan's table with what happened to it (chosen, or why it lost),
so `trainmaster offers` and `submit --dry-run` can explain the choice.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from trainmaster.backends.base import Backend, Offer, OfferSet
from trainmaster.broker.policy import Policy
from trainmaster.jobs.spec import JobSpec

OFFER_TIMEOUT_S = 10.0
DEFAULT_HOURS = 1.0


@dataclass(frozen=True)
class Considered:
    offer: Offer
    hours: float
    expected_micro_usd: int
    verdict: str  # "chosen" or why it lost


@dataclass
class Plan:
    rows: list[Considered] = field(default_factory=list)
    reasons: dict[str, list[str]] = field(default_factory=dict)  # backend -> why it offered nothing

    @property
    def chosen(self) -> Considered | None:
        return next((r for r in self.rows if r.verdict == "chosen"), None)

    def explain_failure(self) -> str:
        lines = ["no backend can run this job:"]
        lines += [f"  {name}: {'; '.join(why)}" for name, why in self.reasons.items()]
        lines += [f"  {r.offer.key}: {r.verdict}" for r in self.rows]
        return "\n".join(lines)


class PlanError(RuntimeError):
    def __init__(self, plan: Plan):
        self.plan = plan
        super().__init__(plan.explain_failure())


async def gather_offers(spec: JobSpec, backends: dict[str, Backend]) -> list[OfferSet]:
    async def one(name: str, backend: Backend) -> OfferSet:
        try:
            return await asyncio.wait_for(backend.offers(spec), OFFER_TIMEOUT_S)
        except asyncio.TimeoutError:
            return OfferSet(backend=name, reasons=[f"no answer within {OFFER_TIMEOUT_S:.0f} s"])
        except Exception as exc:  # a broken backend must not stop the others from offering
            return OfferSet(backend=name, reasons=[f"error while listing offers: {exc}"])

    return list(await asyncio.gather(*(one(n, b) for n, b in backends.items())))


def plan(spec: JobSpec, policy: Policy, offer_sets: list[OfferSet], *, blocked: frozenset[str] = frozenset()) -> Plan:
    """Choose among offers by the policy of the spec's workload class."""
    cls = policy.for_class(spec.workload)
    allowed = set(cls.constraints.allowed_backends or cls.chain)
    cap = min(x for x in (cls.constraints.max_usd_per_hour, spec.limits.max_usd_per_hour, 2**63) if x is not None)
    hours = spec.estimated_hours or spec.limits.max_hours or DEFAULT_HOURS
    result = Plan(reasons={s.backend: s.reasons for s in offer_sets if s.reasons})
    candidates = []
    for offer in (o for s in offer_sets for o in s.offers):
        expected = -(-int(offer.price_per_hour_micro_usd * hours * 1000) // 1000) * offer.nodes
        verdict = _filter(offer, allowed, cap, blocked, spec, expected)
        row = Considered(offer=offer, hours=hours, expected_micro_usd=expected, verdict=verdict or "")
        (candidates if verdict is None else result.rows).append(row)
    rank = {name: i for i, name in enumerate(cls.chain)}
    if cls.objective == "fastest":
        candidates.sort(key=lambda r: (r.offer.expected_start_s, r.expected_micro_usd, rank.get(r.offer.backend, 99)))
    else:
        candidates.sort(key=lambda r: (r.expected_micro_usd, rank.get(r.offer.backend, 99), r.offer.expected_start_s))
    for i, row in enumerate(candidates):
        verdict = "chosen" if i == 0 else f"costlier than {candidates[0].offer.key}"
        result.rows.insert(i, Considered(row.offer, row.hours, row.expected_micro_usd, verdict))
    return result


def _filter(offer: Offer, allowed: set[str], cap: int, blocked: frozenset[str], spec: JobSpec, expected: int) -> str | None:
    if offer.backend not in allowed:
        return f"policy allows only {', '.join(sorted(allowed))}"
    if offer.key in blocked:
        return "blocked after a failed attempt"
    if offer.price_per_hour_micro_usd > cap:
        return "over the $/hour cap"
    if spec.limits.max_usd is not None and expected > spec.limits.max_usd:
        return "expected cost over the job's max_usd"
    return None
