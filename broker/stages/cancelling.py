"""`trainmaster cancel`: a requested state, finished by whichever process holds the job next.

The request is recorded on the job first, then each unfinished attempt ends `cancelled` through its own end (a
running one stopped at its backend, its money settled), then the job; a process that dies half-way leaves the
request, and the next `advance` finishes it (`cancel_now`). Whatever an ended attempt still runs (what a crashed
run left) is stopped too, each stop a `stopped` event.
"""

from __future__ import annotations

import time

from trainmaster.backends.base import Backend, BackendError, Handle
from trainmaster.backends.retry import retried
from trainmaster.broker import failures, states
from trainmaster.broker.stages.job_context import JobContext, Parts
from trainmaster.broker.stages.ledger_moves import end_attempt, release_orphans
from trainmaster.broker.store import Attempt, Job


async def cancel(parts: Parts, job_id: str) -> Job:
    """Cancel an unfinished job: the request is recorded on the job first, then each unfinished attempt
    ends through its own end (`cancel_now`), then the job; a process that dies half-way leaves the
    request, which the next `advance` finishes. For any job, whatever its recorded state, the processes
    its ended attempts still run (what a crashed run left) are stopped, each stop a `stopped` event."""
    store = parts.store
    job = store.find_job(job_id)
    async with parts.locks.held(job.id):
        ctx = parts.job(job.id)
        attempts = ctx.attempts()
        stopped = {a.id for a in attempts if a.state in states.ACTIVE_ATTEMPT}
        # an ended job with an unfinished attempt is what an older version's cancel left: ended here too
        if ctx.job.state not in states.JOB_ENDS or any(a.state not in states.ATTEMPT_ENDS for a in attempts):
            store.request_cancel(job.id)
            await cancel_now(ctx.reread())
        for attempt in ctx.attempts():  # what the cancel did not stop at its backend
            if attempt.handle_json and attempt.id not in stopped:
                await stop_leftovers(ctx, attempt, ctx.backend(attempt.backend),
                                     Handle.model_validate_json(attempt.handle_json))
    return store.job(job.id)


async def cancel_now(ctx: JobContext) -> None:
    """End every unfinished attempt `cancelled` (a running one stopped at its backend first) with its
    money settled, release what a dispatch that died left reserved, then end the job `cancelled`.
    Compute we pay for by the hour is charged what it ran; an untrusted executor's reservation is
    released (it is paid only for accepted work); a queued job just ends."""
    for attempt in ctx.attempts():
        if attempt.state in states.ATTEMPT_ENDS:
            continue
        if attempt.handle_json and attempt.state in states.ACTIVE_ATTEMPT:
            backend = ctx.backend(attempt.backend)
            await retried(backend.cancel, Handle.model_validate_json(attempt.handle_json))
        await end_attempt(ctx, attempt, "cancelled", job_target=None, reason="cancelled by the user",
                          detail={"cause": failures.CANCELLED.name}, ended_at=time.time())
    release_orphans(ctx, keep=None)
    if ctx.job.state not in states.JOB_ENDS:
        ctx.store.move_job(ctx.id, "cancelled", reason="cancelled by the user")


async def stop_leftovers(ctx: JobContext, attempt: Attempt, backend: Backend, handle: Handle) -> None:
    """An attempt recorded as ended whose processes still run: the backend's cancel stops them and
    says how many (a backend that cannot tell says nothing)."""
    try:
        stopped = await retried(backend.cancel, handle)
    except BackendError as exc:
        ctx.log("error", {"message": f"stopping what is left of attempt {attempt.n}: {exc}"}, attempt.id)
        return
    if stopped:
        ctx.log("stopped", {
            "processes": stopped,
            "message": f"attempt {attempt.n} ({attempt.state}) still had {stopped} process(es) running; stopped them",
        }, attempt.id)
