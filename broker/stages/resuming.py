"""Where a job's next attempt starts from, and `trainmaster resume`.

A new attempt on trusted compute resumes from the newest committed state an earlier attempt on the same backend
reports (`last_checkpoint`: a reference only that backend understands, passed back unopened); only states we can
trust are resumed from. `restart` puts a failed or cancelled job back to `planned` on its stored plan, its limits
raised when asked; the broker then advances it. The words the user is told are in broker/resume_point.py.
"""

from __future__ import annotations

import dataclasses

from trainmaster.backends.base import Backend, BackendError, Handle, Offer
from trainmaster.backends.features import CheckpointRef, ResumesFromCheckpoints
from trainmaster.backends.retry import retried
from trainmaster.broker.resume_point import ResumePoint, raised_limits, resume_point
from trainmaster.broker.stages.job_context import JobContext, NothingToDo, Parts
from trainmaster.broker.store import Attempt
from trainmaster.jobs.spec import JobSpec


async def resume_uri(ctx: JobContext, attempt: Attempt, backend: Backend) -> str | None:
    """The reference a new attempt resumes from (`resume_ref`), or None to start afresh."""
    found = await resume_ref(ctx, attempt, backend)
    return found[1].uri if found else None


async def resume_ref(ctx: JobContext, attempt: Attempt, backend: Backend) -> tuple[int, CheckpointRef] | None:
    """(earlier attempt's number, its checkpoint reference): the newest committed state an earlier attempt
    on the same backend reports (`last_checkpoint`: a reference only that backend understands, passed
    back as it is; the broker opens nothing of the backend's). Only states we can trust are resumed
    from: a trusted attempt's that was not rejected, or an accepted one's. A backend that cannot say,
    or cannot be asked now, gives no resume point: the attempt starts afresh."""
    if not isinstance(backend, ResumesFromCheckpoints):
        return None
    for earlier in reversed(ctx.attempts()):
        if earlier.n >= attempt.n or earlier.backend != attempt.backend or not earlier.handle_json:
            continue
        if not resumable_from(earlier):
            continue
        try:
            ref = await retried(backend.last_checkpoint, Handle.model_validate_json(earlier.handle_json))
        except BackendError as exc:
            ctx.log("error", {"message": f"no resume point from attempt {earlier.n}: {exc}"}, attempt.id)
            continue
        if ref is not None:
            return earlier.n, ref
    return None


def resumable_from(attempt: Attempt) -> bool:
    """Whether a later attempt may start from this attempt's states: an untrusted executor's states
    are trusted only once accepted, and a rejected attempt's never."""
    return attempt.state == "accepted" or (attempt.state != "rejected"
                                           and Offer.model_validate_json(attempt.offer_json).trusted)


async def point(ctx: JobContext) -> ResumePoint:
    """Where `resume` would start the job from: a step of an earlier attempt's checkpoints (as its backend
    reports them), or scratch."""
    if ctx.plan is None:
        return resume_point(None, trusted=True)
    offer = ctx.plan.offer
    attempts = ctx.attempts()
    if not offer.trusted or not attempts:
        return resume_point(None, trusted=offer.trusted)
    upcoming = dataclasses.replace(attempts[-1], n=attempts[-1].n + 1, backend=offer.backend)
    found = await resume_ref(ctx, upcoming, ctx.backend(offer.backend))
    return resume_point(found, trusted=True)


async def restart(parts: Parts, job_id: str, *, max_hours: float | None, max_usd: str | None) -> str:
    """Put a failed or cancelled job back to `planned` on its stored plan, from the last committed segment an
    earlier attempt left (a trusted backend's; an untrusted executor always starts afresh), with its `max_hours`
    and `max_usd` raised when given (NothingToDo when a value does not raise them). Returns the job's id."""
    job = parts.store.find_job(job_id)
    async with parts.locks.held(job.id):
        ctx = parts.job(job.id)
        if ctx.job.state not in ("failed", "cancelled"):
            raise NothingToDo(f"{job.id} is {ctx.job.state}; only a failed or cancelled job can be resumed")
        if ctx.plan is None:
            raise NothingToDo(f"{job.id} was never planned ({ctx.job.reason}); submit it again instead")
        raise_limits(ctx, max_hours, max_usd)
        found = await point(ctx)
        parts.store.move_job(job.id, "planned", reason=f"resumed by the user; {found.sentence()}")
    return job.id


def raise_limits(ctx: JobContext, max_hours: float | None, max_usd: str | None) -> None:
    spec = ctx.spec
    try:
        fields, shown = raised_limits(spec.limits.model_dump(), max_hours, max_usd)
    except ValueError as exc:
        raise NothingToDo(f"{ctx.id}: {exc}") from None
    if not fields:
        return
    raised = {**spec.model_dump(mode="json"), "limits": {**spec.limits.model_dump(mode="json"), **fields}}
    ctx.store.set_spec(ctx.id, JobSpec.model_validate(raised).model_dump_json(),
                       reason="raised for the resume: " + ", ".join(f"{k} {a} → {b}" for k, (a, b) in shown.items()))
