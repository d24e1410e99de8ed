"""The watch stage: an unfinished attempt's backend asked for its status, and the answer recorded.

A run that started is marked running; one that reached the job's cost cap (`limits.max_usd`) is stopped and ends
the job `failed` with the cap as the reason; one that succeeded is collected (broker/stages/collect.py); one that
failed or was cancelled gets the reaction its cause calls for (broker/stages/reactions.py). An attempt whose start
died before its handle was recorded is started again first.
"""

from __future__ import annotations

import time

from trainmaster.backends.base import Phase
from trainmaster.backends.features import NotesInRunLog
from trainmaster.backends.retry import retried
from trainmaster.broker import failures, pairs, states
from trainmaster.broker.money import cost_cap
from trainmaster.broker.stages import dispatch, refereeing
from trainmaster.broker.stages.collect import collect
from trainmaster.broker.stages.job_context import JobContext
from trainmaster.broker.stages.ledger_moves import end_attempt, record_cost
from trainmaster.broker.stages.reactions import asked_status, react
from trainmaster.broker.store import Attempt


async def watch(ctx: JobContext, attempt: Attempt) -> None:
    if attempt.referee_pair:  # a refereed pair (broker/pairs.py): the lead moves the job, its partner does not
        attempt = ctx.store.attempt(attempt.id)  # its partner's step, earlier in this pass, may have moved it
        if attempt.state in states.ATTEMPT_ENDS:
            return
        if pairs.waits_behind(ctx.store, attempt):
            await refereeing.watch_partner(ctx, attempt)
            return
        await dispatch.start_partner(ctx, attempt)  # a dispatch that died between the two
        refereeing.catch_up(ctx, attempt)  # a partner become the lead: the job comes to where it is
    if attempt.state in ("returned", "verifying"):
        await collect(ctx, attempt)
        return
    started = attempt.handle_json is None
    handle = await dispatch.handle(ctx, attempt)
    if started:  # started here: what that recorded
        attempt = ctx.store.attempt(attempt.id)
    if handle is None or attempt.state in states.ATTEMPT_ENDS:
        return  # it could not be started (again): ended, or waiting, as its failure's reaction says
    if (st := await asked_status(ctx, attempt, handle)) is None:
        return
    backend = ctx.backend(attempt.backend)
    if st.phase is Phase.running:
        if attempt.state == "dispatched":
            ctx.store.move_attempt(attempt.id, "running", job_target="running", started_at=st.started_at)
        spec = ctx.spec  # its attempts are read only for a job with a cap
        if spec.limits.max_usd is not None and cost_cap.reached(spec, ctx.attempts(), time.time()):
            if isinstance(backend, NotesInRunLog):  # the log says why, as when the run's own limit stops it
                await backend.note(handle, cost_cap.log_line(spec, cost_cap.spent(ctx.attempts(), time.time())))
            await retried(backend.cancel, handle)
            st = await retried(backend.status, handle)
            await stopped_at_cap(ctx, ctx.store.attempt(attempt.id), st)
    elif st.phase in (Phase.failed, Phase.cancelled) and await over_cap(ctx, attempt):
        await stopped_at_cap(ctx, attempt, st)  # stopped by its backend at the cap, or by us before a crash
    elif st.phase is Phase.succeeded:
        ctx.store.move_attempt(attempt.id, "returned", job_target="returned",
                               started_at=st.started_at, ended_at=st.ended_at)
        await collect(ctx, ctx.store.attempt(attempt.id))
    elif st.phase in (Phase.failed, Phase.cancelled):
        cause = failures.cause_of(st.phase is Phase.cancelled, st.cause, st.exit_code)
        await react(ctx, attempt, cause, st.reason or cause.value, started_at=st.started_at, ended_at=st.ended_at)


async def over_cap(ctx: JobContext, attempt: Attempt) -> bool:
    """Whether the job's spend, this ended attempt's cost recorded, has reached its limits.max_usd."""
    if ctx.spec.limits.max_usd is None:
        return False
    await record_cost(ctx, attempt)
    return cost_cap.reached(ctx.spec, ctx.attempts(), time.time())


async def stopped_at_cap(ctx: JobContext, attempt: Attempt, st) -> None:
    """End the attempt and the job `failed` with the cap as the reason; what it spent is charged (a refereed
    pair's partner is stopped and ended with it)."""
    await record_cost(ctx, attempt)
    why = cost_cap.reason(ctx.spec, cost_cap.spent(ctx.attempts(), time.time()))
    await refereeing.stop_partner(ctx, attempt, why)
    await end_attempt(ctx, attempt, "failed", job_target="failed", reason=why,
                      started_at=st.started_at, ended_at=st.ended_at)
