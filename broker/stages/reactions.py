"""Reactions: what stopped an attempt gets the one reaction broker/failures.py keeps for its cause.

The attempt is ended (its money settled), its executor banned when it cheated, and the job failed, tried again on
the same offer (resuming from its last committed segment, while the class's `retries` allow), re-planned on the
next offer, or cancelled; a transient failure keeps the attempt as it is until it has been unreachable past the
class's `unreachable_after_s`, and a failure on our own side (a full disk) keeps it waiting with what to fix.
"""

from __future__ import annotations

import asyncio
import time

from trainmaster.backends.base import Cause, Offer
from trainmaster.broker import failures, pairs, states
from trainmaster.broker.executors import ban_rejected
from trainmaster.broker.stages.job_context import JobContext
from trainmaster.broker.stages.ledger_moves import end_attempt
from trainmaster.broker.stages.offer_rounds import replan
from trainmaster.broker.store import Attempt


async def react(ctx: JobContext, attempt: Attempt, failure: failures.Failure, reason: str, *,
                started_at: float | None = None, ended_at: float | None = None) -> None:
    """The one reaction (`broker.failures`) to what stopped the attempt: end it, ban its executor,
    and fail the job, fall back, start again on the same offer or cancel; or keep it waiting."""
    reaction = failures.reaction(failure, trusted=Offer.model_validate_json(attempt.offer_json).trusted)
    if reaction is failures.TRANSIENT:
        await unreachable(ctx, attempt, reason)
        return
    if reaction is failures.OUR_ENVIRONMENT:
        message = f"{reason} (on our side: the attempt waits until it is fixed)"
        ctx.log("error", {"message": message, "cause": reaction.name}, attempt.id)
        raise failures.Waiting(message)
    if reaction.ban:
        ban_rejected(ctx.parts.executors, hotkey=attempt.executor_hotkey, coldkey=attempt.executor_coldkey,
                     reason=reason, job_id=ctx.id, attempt_id=attempt.id)
    if reaction.attempt == "rejected":
        await asyncio.to_thread(record_fault_verdict, ctx, attempt, reason)
    if pairs.partner_alive(ctx.store, attempt):  # a refereed pair's other attempt goes on, and the job with it
        await end_attempt(ctx, attempt, reaction.attempt, job_target=None, reason=reason,
                          detail={"cause": reaction.name}, started_at=started_at, ended_at=ended_at)
        return
    after = reaction.job
    if after == "same_offer" and retries_left(ctx, attempt) <= 0:
        after = "fallback"
    job_target = after if after in states.JOB_ENDS else "planned"
    await end_attempt(ctx, attempt, reaction.attempt, job_target=job_target, reason=reason,
                      detail={"cause": reaction.name}, started_at=started_at, ended_at=ended_at)
    if after == "same_offer":  # the stored plan stands: the next attempt resumes from the last committed segment
        offer_key = Offer.model_validate_json(attempt.offer_json).key
        ctx.log("retry", {"after": reason, "offer": offer_key, "retries_left": retries_left(ctx, attempt) - 1},
                attempt.id)
    elif after == "fallback":
        await replan(ctx.reread(), after=reason)


def retries_left(ctx: JobContext, attempt: Attempt) -> int:
    """Retries the policy still allows on this attempt's offer after a crash (`retries` per class)."""
    allowed = ctx.policy.for_class(ctx.job.workload).retries
    key = Offer.model_validate_json(attempt.offer_json).key
    used = sum(1 for a in ctx.attempts()
               if a.n < attempt.n and a.state == "failed" and Offer.model_validate_json(a.offer_json).key == key)
    return allowed - used


def record_fault_verdict(ctx: JobContext, attempt: Attempt, reason: str) -> None:
    """An attempt rejected for what its executor sent, before any check ran, gets its verdict stored
    like any other (once): `verify show` tells it, and its conclusion may reveal the challenge secret."""
    from trainmaster.verify.records import VerdictStore
    from trainmaster.verify.verdict import Verdict

    verdicts = VerdictStore(ctx.store.path)
    try:
        if verdicts.latest(ctx.id, attempt.id) is None:
            verdicts.record(Verdict(outcome="rejected", reasons=[reason], evidence={"executor_fault": reason},
                                    job_id=ctx.id, attempt_id=attempt.id))
    finally:
        verdicts.close()


async def unreachable(ctx: JobContext, attempt: Attempt, reason: str) -> None:
    """A backend that answers only with transient errors (each call already retried, bounded): the
    attempt keeps its state until it has been unreachable past the class's `unreachable_after_s`
    (first-unreachable time stored), then it is lost: retried on the same offer, then elsewhere."""
    since = ctx.store.mark_unreachable(attempt.id, reason)
    limit = ctx.policy.for_class(ctx.job.workload).unreachable_after_s
    if time.time() - since >= limit:
        await react(ctx, ctx.store.attempt(attempt.id), Cause.lost,
                    f"lost: unreachable for {time.time() - since:.0f} s, past the policy's "
                    f"unreachable_after_s ({limit:g} s): {reason}")


def reachable(ctx: JobContext, attempt: Attempt) -> None:
    """The attempt's backend answered: an unreachable mark it carried is cleared."""
    if attempt.unreachable_since is not None:
        ctx.store.mark_reachable(attempt.id)


async def asked_status(ctx, attempt, handle):
    """The backend's status of a live attempt, its reachability recorded; None when an overdue deadline or the
    asking itself ended it (the reaction already taken). Shared by the watch of a job and of a refereed pair."""
    from trainmaster.backends.base import BackendError
    from trainmaster.backends.retry import retried
    from trainmaster.broker import deadlines

    backend = ctx.backend(attempt.backend)
    grace_s = getattr(backend, "overrun_grace_s", deadlines.OVERRUN_GRACE_S)  # (RunsUntrusted's; others: trusted)
    if (why := deadlines.overdue(ctx.spec, attempt, grace_s=grace_s)) and (
            ended := await deadlines.judged(backend, handle, why)):
        await react(ctx, attempt, *ended)  # an untrusted run past its time, on the broker's clock
        return None
    try:
        st = await retried(backend.status, handle)
    except BackendError as exc:
        await react(ctx, attempt, exc, f"asking {attempt.backend} for the status: {exc}")
        return None
    reachable(ctx, attempt)
    return st
