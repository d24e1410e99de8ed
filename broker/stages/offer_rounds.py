"""Rounds of offers, the planning stage: offers gathered from every enabled backend and one chosen by the
policy, at submit, again after a failed attempt (`replan`), and for a planned offer whose quote expired before
dispatch (`requoted`).

A plan is made once and stored with the job (broker/planning/stored_plan.py); what past attempts teach the
planner (`learned`: runtimes, failure rates, executors' reputation) and the executors banned across jobs
(`banned_offers`) are read from the state each time offers are gathered.
"""

from __future__ import annotations

import statistics
import time

from trainmaster.backends.base import Offer, OfferSet
from trainmaster.backends.features import AllocatesMachine
from trainmaster.broker import readiness
from trainmaster.broker.auditability import auditable_backends
from trainmaster.broker.money import budget_wait
from trainmaster.broker.planning.estimate import own_estimate, past_run
from trainmaster.broker.planning.fallback_reason import no_fallback_reason
from trainmaster.broker.planning.offer_request import current_rate, offer_request
from trainmaster.broker.planning.planner import Plan, gather_offers, plan as choose, reference_hours
from trainmaster.broker.planning.referee_pair import pair_up
from trainmaster.broker.planning.stored_plan import StoredPlan, requote
from trainmaster.broker.planning.policy import Policy
from trainmaster.broker.planning.tier import verification_tier
from trainmaster.broker.stages.job_context import JobContext, Parts
from trainmaster.broker.store import Attempt
from trainmaster.jobs.spec import JobSpec
from trainmaster.wallet.ledger import Ledger

HISTORY_RUNS = 20  # newest accepted runs of a class that estimate its runtime
MIN_ATTEMPTS_FOR_RATE = 5  # ended attempts of a backend before its failure rate prices risk
MAX_FAILURE_RATE = 0.99  # a backend that failed every time is priced as nearly sure to fail (the planner needs < 1)


async def plan(parts: Parts, spec: JobSpec, policy: Policy, blocked: frozenset[str] = frozenset()) -> Plan:
    """Gather offers from every enabled backend (once) and choose by the policy; the offers of a banned
    hotkey or coldkey (`trainmaster executors ls`) are blocked like failed ones, in every job."""
    parts.offer_rounds += 1
    rate, rate_problem = await current_rate(parts.backends.rates(policy))
    request = offer_request(spec, policy, rate)
    enabled, refused = auditable_backends(spec, policy, parts.backends.enabled(spec, policy))  # refused: never asked
    unready = readiness.unready([n for n in enabled if n not in parts.backends.given],
                                parts.backends.effective_configs(policy))
    offer_sets: list[OfferSet] = await gather_offers(request, {n: b for n, b in enabled.items() if n not in unready},
                                                     valid_s=policy.offers.valid_s,
                                                     rate_max_age_s=policy.tao_rate.max_age_s)
    offer_sets += [*readiness.as_offer_sets(unready), *refused]
    hotkeys, coldkeys = parts.executors.banned()
    banned = frozenset(banned_offers(offer_sets, hotkeys, coldkeys)) if hotkeys or coldkeys else frozenset()
    history, failure_rates = learned(parts.store.ended_attempts())
    result = choose(spec, policy, offer_sets, blocked=blocked, banned=banned, history=history,
                    failure_rates=failure_rates, data_bytes=request.data_bytes, total_steps=request.total_steps,
                    own=own_estimate(spec, [past_run(a, spec_json) for a, spec_json
                                            in parts.store.accepted_runs(spec.name, HISTORY_RUNS)]))
    result.notes += [rate_problem] if rate_problem else []
    if verification_tier(spec, policy) == "refereed":
        pair_up(result, spec)  # two miners of different coldkeys, drawn at random (about 2x the cost)
    return result


def budget_refusal(parts: Parts, spec: JobSpec, policy: Policy, plan_: Plan) -> str | None:
    """Why dispatching the plan's choice would be refused by a budget now (what `submit` would say)."""
    if plan_.chosen is None:
        return None
    offer = plan_.chosen.offer
    with Ledger(parts.store.db, budgets=policy.budgets) as ledger:
        refused = ledger.refusal(backend=offer.backend, workload=spec.workload, project=spec.project,
                                 micro_usd=plan_.chosen.expected_micro_usd
                                 + (plan_.partner.expected_micro_usd if plan_.partner else 0))
    return budget_wait.reason(refused) if refused else None


def start_preview(parts: Parts, spec: JobSpec, policy: Policy, offer: Offer) -> str | None:
    """Whether a job planned on `offer` would start now or wait in the queue (None: the backend
    does not allocate a machine, so it always starts)."""
    backend = parts.backends.backend(offer.backend, policy)
    if not isinstance(backend, AllocatesMachine):
        return None
    return parts.store.start_preview(offer.backend, lambda held: backend.fit(spec, held))


def record_plan(parts: Parts, job_id: str, result: Plan, *, seq: int) -> None:
    stored = StoredPlan.of(result, seq)
    parts.store.set_plan(job_id, stored.model_dump_json(), detail=stored.event())


async def replan(ctx: JobContext, after: str | None = None) -> None:
    """A new plan after a failed attempt (offers gathered again, the failed ones and the executors
    caught cheating blocked)."""
    result = await plan(ctx.parts, ctx.spec, ctx.policy, blocked=ctx.blocked())
    if result.chosen is None:
        reason = result.explain_failure()
        if after:  # the attempt's own reason first: that is what the user must fix
            reason = no_fallback_reason(after, result, ctx.job.policy)
        ctx.store.move_job(ctx.id, "failed", reason=reason)
        return
    record_plan(ctx.parts, ctx.id, result, seq=ctx.plan.seq + 1 if ctx.plan else 1)


async def requoted(ctx: JobContext, stored: StoredPlan) -> StoredPlan | None:
    """The stored plan, with its offer quoted again when its price no longer holds: the same offer when
    the backend still makes it at a cost within the plan, else a new plan (None: none is left, and
    the job has failed saying why). Each re-quote is a `requoted` event."""
    if not stored.offer.expired(time.time()):
        return stored
    result = await plan(ctx.parts, ctx.spec, ctx.policy, blocked=ctx.blocked())
    again = requote(stored, result)
    if again is None:
        ctx.store.move_job(ctx.id, "failed", reason=f"the planned offer {stored.offer.key} expired and no "
                                                    f"offer is left:\n" + result.explain_failure())
        return None
    outcome = "same offer" if again.offer.key == stored.offer.key else "re-planned"
    ctx.store.requote_plan(ctx.id, again.model_dump_json(), detail={
        "offer": stored.offer.key, "expired_at": stored.offer.valid_until, "outcome": outcome,
        "chosen": again.offer.key, "planned_micro_usd": stored.expected_micro_usd,
        "expected_micro_usd": again.expected_micro_usd, "quote": again.offer.quote})
    return again


def learned(ended: list[tuple[Attempt, str]]) -> tuple[dict[str, float], dict[str, float]]:
    """What past attempts teach the planner: the median runtime of each workload class (in reference
    GPU-hours), each backend's failure rate once it has run enough attempts to say, and each untrusted
    executor's own rate keyed by its offer (reputation: failed or rejected over its attempts plus one, so
    one bad attempt of a newcomer prices half its compute as risk, and a long record counts in full)."""
    runtimes: dict[str, list[float]] = {}
    outcomes: dict[str, list[bool]] = {}
    by_executor: dict[str, list[bool]] = {}
    for attempt, workload in ended:
        offer = Offer.model_validate_json(attempt.offer_json)
        if attempt.state == "accepted" and attempt.billable_seconds:
            runtimes.setdefault(workload, []).append(reference_hours(attempt.billable_seconds / 3600, offer.gpu_type))
        if attempt.state in ("accepted", "failed"):
            key = f"{offer.backend}:{'spot' if offer.spot else 'on-demand'}"
            outcomes.setdefault(key, []).append(attempt.state == "failed")
        if attempt.executor_hotkey and attempt.state in ("accepted", "failed", "rejected"):
            by_executor.setdefault(offer.key, []).append(attempt.state != "accepted")
    history = {w: statistics.median(hours[:HISTORY_RUNS]) for w, hours in runtimes.items()}
    rates = {k: min(sum(fails) / len(fails), MAX_FAILURE_RATE) for k, fails in outcomes.items()
             if len(fails) >= MIN_ATTEMPTS_FOR_RATE}
    rates |= {k: sum(fails) / (len(fails) + 1) for k, fails in by_executor.items() if any(fails)}
    return history, rates


def banned_offers(offer_sets: list[OfferSet], hotkeys: frozenset[str], coldkeys: frozenset[str]) -> set[str]:
    """Keys of the offers made by a banned hotkey or a banned coldkey's hotkeys. An offer's `detail` is
    what the executor quoted: a coldkey that is not a string matches nothing (and breaks nothing)."""
    def owner(offer: Offer) -> str | None:
        coldkey = offer.detail.get("coldkey")
        return coldkey if isinstance(coldkey, str) else None

    return {o.key for s in offer_sets for o in s.offers
            if not o.trusted and (o.instance in hotkeys or owner(o) in coldkeys)}
