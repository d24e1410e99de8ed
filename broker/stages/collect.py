"""The collect stage: an attempt that returned has its outputs fetched (every file hashed as it arrives), kept or
dropped (the spec's `outputs`; from untrusted compute only the files its signed commitment binds), its cost
recorded, and its verdict made (broker/stages/verification.py). An accepted attempt's outputs are put in the
shared storage, the job is accepted, promoted into the model registry and its disk given back under the
retention policy; a rejected one gets its reaction; one whose checks could not run waits `unverified`.
Each step is idempotent: a verdict already stored is not made again.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

from trainmaster.backends.base import BackendError, Cause, Offer
from trainmaster.backends.retry import retried
from trainmaster.broker import failures, paths, states
from trainmaster.broker.auditability import job_fault
from trainmaster.broker.filekeeping import shared_outputs, shared_storage
from trainmaster.broker.stages import dispatch, refereeing
from trainmaster.broker.stages.job_context import JobContext, NothingToDo, Parts
from trainmaster.broker.stages.ledger_moves import end_attempt, record_cost
from trainmaster.broker.stages.reactions import reachable, react
from trainmaster.broker.stages.verification import final_verdict, verify
from trainmaster.broker.store import Attempt, Store
from trainmaster.jobs import outputs as kept_outputs


async def collect(ctx: JobContext, attempt: Attempt) -> None:
    """Fetch outputs, record them and the cost, and decide. Each step is idempotent."""
    backend = ctx.backend(attempt.backend)
    handle = await dispatch.handle(ctx, attempt)
    dest = paths.job_dir(ctx.id) / "outputs"
    hashed_now = False
    if attempt.state == "returned":
        if not ctx.store.outputs(attempt.id):  # an earlier attempt's folder is never judged as this one's
            await asyncio.to_thread(shutil.rmtree, dest, True)
        trusted = Offer.model_validate_json(attempt.offer_json).trusted
        try:  # a full disk waits on us; an altered transfer is its executor's fault (ours: retried, then failed)
            files = await retried(backend.fetch, handle, dest, ctx.parts.progress, on=failures.retried_errors(trusted))
        except BackendError as exc:
            await react(ctx, attempt, exc, f"fetching the outputs from {attempt.backend}: {exc}")
            return
        reachable(ctx, attempt)
        chosen = kept_outputs.select([(f.path, f.size) for f in files], ctx.spec.outputs)
        await asyncio.to_thread(kept_outputs.remove, dest, chosen.dropped)  # excluded: not kept
        if chosen.too_big:
            await react(ctx, attempt, Cause.script_failed, chosen.too_big)
            return
        kept, dropped = committed(attempt, chosen.kept)
        ctx.store.record_outputs(attempt.id, [(f.path, f.size, f.sha256) for f in files if f.path in kept])
        await record_cost(ctx, attempt)
        ctx.store.move_attempt(attempt.id, "verifying", job_target="verifying",
                               detail={"dropped": list(dropped)} if dropped else None)
        hashed_now = True
    verdict = None if hashed_now else final_verdict(ctx, attempt)  # stored before the process died
    judged = None
    if verdict is None and attempt.referee_pair:  # the refereed tier: the pair's ruling first
        judged = await refereeing.judge(ctx, ctx.store.attempt(attempt.id), backend, handle)
        if judged is None:
            return  # its partner still runs: the lead waits, verifying
        if judged.release:  # its partner was upheld, its own bits cannot be judged here: unpaid, unbanned
            await end_attempt(ctx, attempt, "failed", job_target=None, reason=judged.release)
            return
        verdict = judged.verdict
    verdict = verdict or await verify(ctx, ctx.store.attempt(attempt.id), dest, backend, handle, hashed_now,
                                      dropped_files(ctx, attempt), judged)
    # judged with the rest (a pickle among them still rejects the attempt), never kept
    await asyncio.to_thread(kept_outputs.remove, dest, dropped_files(ctx, attempt))
    if verdict.outcome == "accepted":
        await share_outputs(ctx, attempt, dest)
        await refereeing.accept_agreed(ctx, attempt)  # its agreed partner: accepted and paid too
        opaque = [item["path"] for item in (verdict.evidence.get("safety") or {}).get("opaque", [])]
        await end_attempt(ctx, attempt, "accepted", job_target="accepted",
                          detail={"verdict": verdict.outcome, **({"opaque": opaque} if opaque else {})})
        await promote(ctx.store, ctx.id)
        await give_back_disk(ctx)
    elif verdict.outcome == "cannot_verify" and (fault := job_fault(verdict.evidence)):
        await react(ctx, attempt, Cause.script_failed, fault)  # the job's own shape: nobody is banned
    elif verdict.outcome == "cannot_verify":
        # the checks could not run (a missing package, a full disk): nothing is paid or blocked; the
        # attempt waits for `trainmaster verify JOB --again`
        why = f"cannot verify: {'; '.join(verdict.reasons)}"
        ctx.store.move_attempt(attempt.id, "unverified", job_target="unverified", reason=why)
    else:  # rejected: nothing is paid, the offer is blocked, who ran it is banned, the next one tried
        await react(ctx, attempt, failures.REJECTED, f"rejected: {'; '.join(verdict.reasons)}")


async def verify_again(parts: Parts, job_id: str) -> str:
    """Run the checks again on the job's unverified attempt (after the user fixed what stopped them); returns the
    job's id (NothingToDo when none waits)."""
    job = parts.store.find_job(job_id)
    async with parts.locks.held(job.id):
        waiting = [a for a in parts.store.attempts(job.id) if a.state in states.WAITING]
        if not waiting:
            raise NothingToDo(f"{job.id} has no attempt waiting to be verified again (the job is {job.state})")
        for attempt in waiting:
            parts.store.move_attempt(attempt.id, "verifying", job_target="verifying", reason="verified again")
            await collect(parts.job(job.id), parts.store.attempt(attempt.id))
    return job.id


async def share_outputs(ctx: JobContext, attempt: Attempt, outputs: Path) -> None:
    """Put the accepted attempt's kept outputs in the shared storage (when set) before the job is accepted, and
    record where (broker/filekeeping/shared_outputs.py): a failure leaves the attempt verifying, its verdict
    stored, and the next pass puts them again."""
    store = shared_storage.store()
    if store is None or any(e.kind == shared_outputs.SHARED_EVENT for e in ctx.store.events(ctx.id)):
        return
    detail = await retried(shared_outputs.publish, store, shared_storage.setting(), ctx.id, attempt.id, outputs,
                           ctx.store.outputs(attempt.id), ctx.parts.upload_progress)
    ctx.log(shared_outputs.SHARED_EVENT, detail, attempt.id)


async def promote(store: Store, job_id: str | None = None) -> None:
    """Record the accepted job's lineage and promote it into the model registry (broker/promotion/), or,
    with no job, carry on the promotions left pending. A failure is an `error` event, never the job's: it
    stays accepted and the promotion is retried by the next pass."""
    from trainmaster.broker.promotion import hook

    try:
        if job_id is None:
            await asyncio.to_thread(hook.retry_pending, store)
        else:
            await asyncio.to_thread(hook.on_accepted, store, job_id)
    except Exception as exc:  # noqa: BLE001 — recorded, retried by the next pass
        if job_id is None:
            logging.getLogger(__name__).warning("retrying pending promotions: %s: %s", type(exc).__name__, exc)
        else:
            store.log_event(job_id, "error", {"message": f"promotion: {type(exc).__name__}: {exc}"})


async def give_back_disk(ctx: JobContext) -> None:
    """The retention policy once a job is accepted (broker/filekeeping/reclaim.py): what it frees is a `disk` event; a
    failure (an invalid retention.yaml, a disk error) is an `error` event, never the job's."""
    from trainmaster.broker.filekeeping import reclaim
    from trainmaster.broker.filekeeping.retention import load_retention
    from trainmaster.jobs.yamlfile import FileError

    try:
        retention = load_retention()
        segments = (await reclaim.job_segments(ctx.store, ctx.id, ctx.parts.backend_of)
                    if retention.drop_accepted_segments else [])
        freed = await reclaim.give_back(segments, ctx.parts.backends.envs_dir(), retention.envs_max_bytes)
    except (FileError, OSError, BackendError) as exc:
        ctx.log("error", {"message": f"giving disk back: {exc}"})
        return
    if freed:
        sizes = ", ".join(f"{kind} {size / 1e6:.1f} MB" for kind, size in reclaim.by_kind(freed).items() if size)
        ctx.log("disk", {"reason": f"gave back {sizes} (retention.yaml; `trainmaster gc`)"})


def dropped_files(ctx: JobContext, attempt: Attempt) -> tuple[str, ...]:
    """The files dropped from the attempt's outputs when it was fetched (recorded on its move to verifying)."""
    return tuple(path for e in ctx.store.events(ctx.id) if e.attempt_id == attempt.id and e.to_state == "verifying"
                 for path in (e.detail or {}).get("dropped", []))


def committed(attempt: Attempt, fetched: tuple[str, ...]) -> tuple[set[str], tuple[str, ...]]:
    """The fetched files kept, and those dropped: from untrusted compute only the files bound to the signed
    commitment are kept (verify/committed.py); trusted compute's are all kept."""
    if Offer.model_validate_json(attempt.offer_json).trusted:
        return set(fetched), ()
    from trainmaster.verify.committed import committed_outputs

    chosen = committed_outputs(fetched)
    return set(chosen.kept), chosen.dropped
