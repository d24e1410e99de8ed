"""The state machine, driven from whatever state is recorded: `advance` moves a job as far as it can go now.

Under the job's lock it finishes a cancel a process left half-done, plans a job recorded without a plan, dispatches
a planned or queued one, and watches each unfinished attempt (which collects, verifies and settles one that
returned); then an untrusted attempt with a verdict is settled with its executor. Each step is idempotent, so any
process (the CLI that submitted, the daemon's reconciler) can call it after a crash.
"""

from __future__ import annotations

from trainmaster.broker import failures, states
from trainmaster.broker.stages.cancelling import cancel_now
from trainmaster.broker.stages.dispatch import dispatch
from trainmaster.broker.stages.job_context import Parts
from trainmaster.broker.stages.ledger_moves import settle_with_executors
from trainmaster.broker.stages.offer_rounds import replan
from trainmaster.broker.stages.watch import watch
from trainmaster.broker.store import Job


async def advance(parts: Parts, job_id: str) -> Job:
    """Move a job as far as it can go now; safe to call from any process at any time. A queued job
    first has the jobs that hold the machine brought up to date, so a run that ended frees its place.
    An untrusted attempt with a verdict is then settled with its executor (broker/money/settlement.py)."""
    seen = parts.store.job(job_id)
    if seen.state == "queued":
        await advance_holders(parts)
    job = await advance_one(parts, job_id, seen)
    await settle_with_executors(parts, job_id)
    return job


async def advance_holders(parts: Parts) -> None:
    for holder in parts.store.holders():
        try:
            await advance_one(parts, holder)
        except failures.Waiting:
            pass  # recorded on the attempt, with what to fix
        except Exception as exc:  # noqa: BLE001 — recorded on that job, retried by the next command
            parts.store.log_event(holder, "error", {"message": f"{type(exc).__name__}: {exc}"})


async def advance_one(parts: Parts, job_id: str, seen: Job | None = None) -> Job:
    """Advance the job; `seen`: its row as the caller just read it (an ended job is left there). Under
    its lock the row is read again, and again only after a step that may have moved it (a watch that
    wrote nothing did not)."""
    store = parts.store
    job = seen or store.job(job_id)
    if job.state in states.JOB_ENDS:
        return job
    async with parts.locks.held(job_id):
        job = store.job(job_id)
        if job.cancel_requested_at is not None and job.state not in states.JOB_ENDS:
            await cancel_now(parts.of(job))  # what a process that died while cancelling left
            return store.job(job_id)
        if job.state == "submitted" or (job.state == "planned" and not job.plan_json):
            await replan(parts.of(job))  # recorded, but the process died before its plan was
            job = store.job(job_id)
        if job.state in ("planned", "queued"):
            await dispatch(parts.of(job))
            job = store.job(job_id)
        for attempt in store.attempts(job_id):
            if attempt.state not in states.ATTEMPT_ENDS | states.WAITING:
                written = store.transactions
                await watch(parts.of(job), attempt)
                if store.transactions != written:  # else the job is as it was read under its lock
                    job = store.job(job_id)
    return job
