"""The dispatch stage: a planned job started on its stored plan's offer (no second planning).

In order: the cost cap checked, the offer quoted again when its quote expired, the budgets previewed, the machine
claimed (a backend that allocates one; else the job waits queued), the planned cost reserved, the attempt
recorded, and its run started on the backend with the attempt's context (where it resumes from, its seed, the
challenge digest an untrusted executor commits to). A start that died before its handle was recorded is
started again (`handle`): `Backend.submit` is idempotent on the attempt id, so it finds the run it started.
"""

from __future__ import annotations

import hashlib
import secrets
import time

from trainmaster.backends.base import AttemptContext, Backend, BackendError, Handle, LocalEnvironmentError, Offer
from trainmaster.backends.features import AllocatesMachine, RunsUntrusted
from trainmaster.backends.retry import retried
from trainmaster.broker import paths
from trainmaster.broker.filekeeping import shared_bundles
from trainmaster.broker.money import budget_wait, cost_cap
from trainmaster.broker.stages import ledger_moves, reactions, resuming
from trainmaster.broker.stages.job_context import JobContext
from trainmaster.broker.stages.offer_rounds import requoted
from trainmaster.broker.store import Attempt
from trainmaster.jobs import bundle as bundles


async def dispatch(ctx: JobContext) -> None:
    """Claim the machine (a backend that allocates one: else the job waits queued), reserve the
    planned cost and start an attempt on the planned offer (no second planning)."""
    store, spec, n = ctx.store, ctx.spec, ctx.store.next_attempt_number(ctx.id)
    if cost_cap.remaining(spec, ctx.attempts(), time.time()) == 0:
        store.move_job(ctx.id, "failed", reason=cost_cap.reason(spec, cost_cap.spent(ctx.attempts(), time.time())))
        return
    stored = await requoted(ctx, ctx.plan)
    if stored is None:
        return  # nothing left to dispatch on: the job failed with the plan's reasons
    if ledger_moves.budget_stands_in_the_way(ctx, ctx.ledger.refusal(
            backend=stored.offer.backend, workload=ctx.job.workload, project=ctx.job.project,
            micro_usd=stored.total_micro_usd)):
        return  # waits for its budget (queued), or failed by it: before a machine is claimed
    offer = claimed(ctx, stored.offer, n)
    if offer is None:
        return  # queued
    key = ledger_moves.reserve(ctx, stored, offer, n)
    if key is None:
        return  # a budget refused the reservation
    if ctx.job.reason and ctx.job.reason.startswith(budget_wait.WAITING):
        store.budget_wait_over(ctx.id, budget_wait.WAITING)
    seed, nonce = spec.seed, None
    if not offer.trusted:  # a fresh S_0 per attempt: another attempt's run never verifies as this one
        nonce = secrets.token_hex(16)
        seed = attempt_seed(seed, nonce)
    paired = stored.partner is not None and not offer.trusted
    attempt = store.create_attempt(ctx.id, backend=offer.backend, offer_json=offer.model_dump_json(),
                                   reserve_key=key, seed=seed, detail={"seed_nonce": nonce} if nonce else None,
                                   pair="self" if paired else None)
    await start(ctx, attempt)
    if paired:
        await start_partner(ctx.reread(), store.attempt(attempt.id))


async def start_partner(ctx: JobContext, first: Attempt) -> None:
    """The refereed tier's second miner (the stored plan's `partner`), started beside the pair's first attempt with
    the same seed and nothing that names the other (broker/pairs.py). Idempotent: a dispatch that died between
    the two is completed by the next `advance`; nothing is started beside a first attempt that has ended."""
    from trainmaster.broker import pairs, states

    stored = ctx.plan
    if (first.referee_pair != first.id or first.state in states.ATTEMPT_ENDS or stored is None
            or stored.partner is None or pairs.other(ctx.store, first) is not None):
        return
    n = ctx.store.next_attempt_number(ctx.id)
    key = ledger_moves.reserve_partner(ctx, stored, n)
    if key is None:
        return  # a budget refused it now: the first attempt is judged alone (logged)
    nonce = next(((e.detail or {}).get("seed_nonce") for e in ctx.store.events(ctx.id)
                  if e.attempt_id == first.id and e.to_state == "dispatched" and e.detail), None)
    partner = ctx.store.create_attempt(ctx.id, backend=stored.partner.backend, offer_json=stored.partner.model_dump_json(),
                                       reserve_key=key, seed=first.seed, pair=first.id,
                                       detail={"seed_nonce": nonce} if nonce else None)
    await start(ctx, partner)


def claimed(ctx: JobContext, offer: Offer, n: int) -> Offer | None:
    """The offer with what attempt `n` holds of the machine, or None when the job waits queued."""
    backend = ctx.backend(offer.backend)
    if not isinstance(backend, AllocatesMachine):
        return offer
    backend.fit(ctx.spec, [])  # the inventory is probed (NVML, torch) before, not inside, the write transaction
    claim = ctx.store.claim(ctx.id, f"{ctx.id}.{n}", offer.backend, lambda held: backend.fit(ctx.spec, held))
    return None if claim is None else backend.claimed(offer, claim)


async def start(ctx: JobContext, attempt: Attempt) -> None:
    offer = Offer.model_validate_json(attempt.offer_json)
    backend = ctx.backend(offer.backend)
    context = await attempt_context(ctx, attempt, offer, backend)
    try:
        bundle = await retried(shared_bundles.fetched, ctx.job.bundle_sha256, ctx.parts.progress)
        handle = await retried(backend.submit, bundle, ctx.spec, offer, context)
    except (BackendError, bundles.BundleError, OSError) as exc:  # a bundle or folder of ours: our side
        failure = exc if isinstance(exc, BackendError) else LocalEnvironmentError(str(exc))
        await reactions.react(ctx, attempt, failure, f"could not start on {offer.backend}: {exc}")
        return
    ctx.store.set_handle(attempt.id, handle.model_dump_json())
    await record_executor(ctx, backend, handle, attempt)


async def handle(ctx: JobContext, attempt: Attempt) -> Handle | None:
    """The attempt's handle; None when it could not be started (what stopped it is recorded)."""
    if attempt.handle_json:
        return Handle.model_validate_json(attempt.handle_json)
    # dispatched, but the process that dispatched died before recording the handle (or the backend
    # could not be reached): submit again, which finds the run it started (idempotent on the attempt id)
    await start(ctx, attempt)
    attempt = ctx.store.attempt(attempt.id)
    return Handle.model_validate_json(attempt.handle_json) if attempt.handle_json else None


async def record_executor(ctx: JobContext, backend: Backend, handle_: Handle, attempt: Attempt) -> None:
    """For an executor we do not control, who it is: its commitment must be signed by this hotkey."""
    if isinstance(backend, RunsUntrusted) and not attempt.executor_hotkey:
        identity = await retried(backend.executor, handle_)
        ctx.store.set_executor(attempt.id, hotkey=identity.hotkey, coldkey=identity.coldkey)


async def attempt_context(ctx: JobContext, attempt: Attempt, offer: Offer, backend: Backend) -> AttemptContext:
    workdir = paths.attempt_dir(ctx.id, attempt.n)
    workdir.mkdir(parents=True, exist_ok=True)
    return AttemptContext(
        job_id=ctx.id, attempt_id=attempt.id, bundle_sha256=ctx.job.bundle_sha256,
        seed=ctx.spec.seed if attempt.seed is None else attempt.seed, workdir=str(workdir),
        # an untrusted executor starts from its own S_0, never from another executor's states
        resume_from=await resuming.resume_uri(ctx, attempt, backend) if offer.trusted else None,
        challenge_digest=None if offer.trusted else challenge_digest(ctx, attempt),
        max_micro_usd=cost_cap.remaining(ctx.spec, ctx.attempts(), time.time()),
    )


def challenge_digest(ctx: JobContext, attempt: Attempt) -> str:
    """sha256 of the attempt's challenge secret: published at dispatch, the secret revealed after the verdict."""
    from trainmaster.verify.records import SecretStore

    secrets_ = SecretStore(ctx.store.path)
    try:
        return secrets_.digest(ctx.id, attempt.id)
    finally:
        secrets_.close()


def attempt_seed(spec_seed: int, nonce: str) -> int:
    """The seed of an untrusted attempt: the spec's seed mixed with a nonce the broker chose (31 bits)."""
    digest = hashlib.sha256(f"trainmaster-attempt-seed-v1:{spec_seed}:{nonce}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFF_FFFF
