"""The money stage: what an attempt costs and the ledger moves it makes, each idempotent on its key.

The expected cost is reserved at dispatch (`reserve`), in the same transaction that checks every matching budget;
a budget whose room other runs' reservations hold makes the job wait (broker/money/budget_wait.py). When an
attempt ends (`end_attempt`) its cost is recorded once (`record_cost`: trusted compute's bill, or an untrusted
executor's price agreed at dispatch, broker/money/executor_price.py) and the reservation is charged or released
(`settle_money`). After the verdict an untrusted executor is paid and told its conclusion exactly once
(`settle_with_executors`, broker/money/settlement.py).
"""

from __future__ import annotations

import time

from trainmaster.backends.base import BackendError, Cost, Handle, Offer
from trainmaster.backends.features import RunsUntrusted
from trainmaster.backends.retry import retried
from trainmaster.broker.money import budget_wait
from trainmaster.broker.money.executor_price import agreed
from trainmaster.broker.planning.stored_plan import StoredPlan
from trainmaster.broker.stages.job_context import JobContext, Parts
from trainmaster.broker.store import Attempt
from trainmaster.wallet.ledger import BudgetExceeded
from trainmaster.wallet.payments import PaymentOrder
from trainmaster.wallet.rates import Rate


def budget_stands_in_the_way(ctx: JobContext, refused: BudgetExceeded | None, *,
                             attempt_id: str | None = None) -> bool:
    """A budget refusing the job's reservation: it waits queued when reservations stand in the way, fails
    when the spend does (broker/money/budget_wait.py); False when nothing refused it."""
    if refused is None:
        return False
    if budget_wait.waits(refused):
        ctx.store.wait_for_budget(ctx.id, budget_wait.reason(refused), attempt_id=attempt_id)
    else:
        ctx.store.move_job(ctx.id, "failed", reason=budget_wait.reason(refused))
    return True


def reserve(ctx: JobContext, stored: StoredPlan, offer: Offer, n: int) -> str | None:
    """Reserve attempt `n`'s planned cost (and, for an untrusted executor, the price agreed for its work); the
    reservation's key, or None when a budget refused it (the job waits or failed, as `budget_stands_in_the_way`).
    A refereed plan's partner (attempt `n + 1`) keeps the reservation it may already hold."""
    key = reserve_key(ctx, stored, n)
    release_orphans(ctx, keep={key, reserve_key(ctx, stored, n + 1)} if stored.partner else {key})
    try:
        _reserve(ctx, key, stored, offer, stored.expected_micro_usd)
    except BudgetExceeded as exc:
        budget_stands_in_the_way(ctx, exc, attempt_id=f"{ctx.id}.{n}")
        return None
    return key


def reserve_partner(ctx: JobContext, stored: StoredPlan, n: int) -> str | None:
    """Reserve the refereed partner's cost as attempt `n` (idempotent: a dispatch that died after reserving it
    finds it); None, logged on the job, when a budget refuses it now (the first attempt then runs alone)."""
    key = reserve_key(ctx, stored, n)
    try:
        _reserve(ctx, key, stored, stored.partner, stored.partner_micro_usd)
    except BudgetExceeded as exc:
        ctx.log("error", {"message": f"the refereed partner could not be reserved ({exc}): the first miner's work is "
                                     "audited alone (sampled tier)"})
        return None
    return key


def reserve_key(ctx: JobContext, stored: StoredPlan, n: int) -> str:
    return f"reserve:{ctx.id}.{n}.p{stored.seq}"


def _reserve(ctx: JobContext, key: str, stored: StoredPlan, offer: Offer, micro_usd: int) -> None:
    price = None if offer.trusted else agreed(offer, stored.hours)  # what an untrusted executor's work is paid
    ctx.ledger.reserve(key, job_id=ctx.id, backend=offer.backend, workload=ctx.job.workload,
                       project=ctx.job.project, micro_usd=micro_usd, rao=price.rao if price else 0,
                       rate_micro_usd_per_tao=price.rate_micro_usd_per_tao if price else None,
                       detail={"offer": offer.key, "hours": stored.hours,
                               **({"agreed_micro_usd": price.micro_usd} if price else {})})


def release_orphans(ctx: JobContext, *, keep: str | set[str] | None) -> None:
    """Release reservations a process made for this job before dying without creating the attempt
    (a crash between `reserve` and `create_attempt`); the ones about to be reused are kept."""
    held = {a.reserve_key or legacy_reserve_key(a) for a in ctx.attempts()}
    kept = {keep} if isinstance(keep, str) else set(keep or ())
    for reservation in ctx.ledger.outstanding():
        if reservation.job_id == ctx.id and reservation.key not in kept and reservation.key not in held:
            ctx.ledger.release(f"release:{reservation.key}", reservation_key=reservation.key,
                               detail={"outcome": "never dispatched (the dispatching process died)"})


async def end_attempt(ctx: JobContext, attempt: Attempt, target: str, *, job_target: str | None,
                      reason: str | None = None, detail: dict | None = None,
                      started_at: float | None = None, ended_at: float | None = None) -> None:
    """Record the cost, settle the money, then move: each step idempotent, so a crash between
    them is repaired by running this again and nothing is paid twice."""
    if attempt.handle_json:
        try:
            await record_cost(ctx, attempt)
        except BackendError as exc:  # unreachable, say: it ends all the same, and nothing is charged
            ctx.log("error", {"message": f"the cost of attempt {attempt.n} could not be had from "
                                         f"{attempt.backend}: {exc}"}, attempt.id)
    settle_money(ctx, ctx.store.attempt(attempt.id), target)
    ctx.store.move_attempt(attempt.id, target, job_target=job_target, reason=reason, detail=detail,
                           started_at=started_at, ended_at=ended_at)


def settle_money(ctx: JobContext, attempt: Attempt, target: str) -> None:
    """Charge what was actually spent, or release the reservation.

    Compute we pay for by the hour whatever happens (our own power, a cloud's bill) is charged
    at its recorded cost on every end; an untrusted executor is paid only for accepted work, the
    price agreed at dispatch, and its payment is recorded with the charge (sent by the settling
    stage, broker/money/settlement.py). A TAO cost is charged in rao with the exchange rate it was priced at.
    """
    offer = Offer.model_validate_json(attempt.offer_json)
    reservation = attempt.reserve_key or legacy_reserve_key(attempt)
    if target == "accepted" or (offer.trusted and attempt.cost_micro_usd is not None):
        payee = attempt.executor_coldkey or attempt.executor_hotkey  # TAO goes to the owner's coldkey when known
        payment = (PaymentOrder(attempt_id=attempt.id, payee=payee, rao=attempt.cost_rao or 0)
                   if not offer.trusted and attempt.executor_hotkey else None)
        ctx.ledger.charge(f"charge:{attempt.id}", reservation_key=reservation, micro_usd=attempt.cost_micro_usd or 0,
                          rao=attempt.cost_rao or 0, rate_micro_usd_per_tao=attempt.cost_rate_micro_usd_per_tao,
                          detail={"outcome": target, "rate_at": attempt.cost_rate_at,
                                  "rate_stale": attempt.cost_rate_at is None
                                  or time.time() - attempt.cost_rate_at > ctx.policy.tao_rate.max_age_s}
                          if attempt.cost_rao else {"outcome": target}, payment=payment)
    else:
        ctx.ledger.release(f"release:{attempt.id}", reservation_key=reservation, detail={"outcome": target})


async def record_cost(ctx: JobContext, attempt: Attempt) -> None:
    """Record what the attempt costs, once: a recorded cost is never asked for again. Trusted compute's
    backend says what it billed; an untrusted executor's cost is the price agreed at dispatch, capped at
    its reservation (`agreed_price`), whatever time it reports."""
    attempt = ctx.store.attempt(attempt.id)
    if attempt.cost_micro_usd is not None or not attempt.handle_json:
        return
    offer = Offer.model_validate_json(attempt.offer_json)
    if offer.trusted:
        backend = ctx.backend(attempt.backend)
        cost = await retried(backend.cost, Handle.model_validate_json(attempt.handle_json), offer)
    else:
        cost = agreed_cost(ctx, attempt, offer)
    if cost.rao:  # the rate a TAO charge is valued at, and whether it was stale when it was used
        rate = Rate(micro_usd_per_tao=cost.rate_micro_usd_per_tao, taken_at=cost.rate_at,
                    source=f"{attempt.backend}'s cost")
        ctx.log("rate", {"at": "settle", **rate.evidence(ctx.policy.tao_rate.max_age_s)}, attempt.id)
    ctx.store.record_cost(attempt.id, micro_usd=cost.micro_usd, rao=cost.rao,
                          billable_seconds=cost.billable_seconds, basis=cost.basis,
                          rate_micro_usd_per_tao=cost.rate_micro_usd_per_tao, rate_at=cost.rate_at)


def agreed_cost(ctx: JobContext, attempt: Attempt, offer: Offer) -> Cost:
    """The price agreed when the attempt was dispatched: the offer's price for the hours its reservation
    was made for, never more than that reservation."""
    reservation = ctx.ledger.entry(attempt.reserve_key or legacy_reserve_key(attempt))
    if reservation is None:
        raise BackendError(f"attempt {attempt.id} has no reservation to take its agreed price from")
    price = agreed(offer, float((reservation.detail or {}).get("hours", 0.0))).capped(reservation.micro_usd)
    return price.cost(rate_at=reservation.at)


def legacy_reserve_key(attempt: Attempt) -> str:
    """The reservation key of attempts recorded before the key was stored with the attempt."""
    return f"reserve:{attempt.id}"


async def settle_with_executors(parts: Parts, job_id: str) -> None:
    """Settle each of the job's untrusted attempts that has a verdict and no acknowledged conclusion:
    its payment sent, its conclusion delivered. A failure (the executor unreachable, a bad
    countersignature) is recorded on the job and tried again by the next command."""
    pending = parts.settlement.pending(job_id)
    if not pending:
        return
    async with parts.locks.held(job_id):
        ctx = parts.job(job_id)
        for _, attempt_id in pending:
            attempt = ctx.store.attempt(attempt_id)
            backend = ctx.backend(attempt.backend)
            if not isinstance(backend, RunsUntrusted) or not attempt.handle_json:
                continue
            charge = ctx.ledger.entry(f"charge:{attempt.id}")
            try:
                await parts.settlement.conclude(ctx.job, attempt, backend,
                                                Handle.model_validate_json(attempt.handle_json),
                                                amount_rao=charge.rao if charge else 0)
            except BackendError as exc:
                ctx.log("error", {"message": f"settling attempt {attempt.n} with its executor: {exc}"}, attempt.id)
