"""Verification, in the collect stage: the checks an attempt gets, and its request to the verification pipeline.

The pipeline runs in the audit pool's worker process (broker/verifying.py); this side says which checks the job's
policy sets for this kind of compute (`checks_for`), gathers what the checks need (the bundle the broker sent, the
outputs recorded, the executor's signature, the metrics of the job's accepted predecessor for the no-regression
rule) and, for the replay audit, has the executor open the challenged segments (`SegmentOpener`).
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from trainmaster.backends.base import (
    Backend, BackendError, Handle, LocalEnvironmentError, Offer, TransientBackendError,
)
from trainmaster.backends.features import KeepsSegments, RunsUntrusted
from trainmaster.backends.retry import ATTEMPTS, retried
from trainmaster.broker import pairs, paths, verifying
from trainmaster.broker.auditability import makes_commitment, untrusted_checks
from trainmaster.broker.filekeeping import shared_bundles
from trainmaster.broker.planning.policy import Policy
from trainmaster.broker.planning.tier import verification_tier
from trainmaster.broker.stages.job_context import JobContext
from trainmaster.broker.store import Attempt, Job, Store
from trainmaster.jobs.spec import JobSpec


async def verify(ctx: JobContext, attempt: Attempt, outputs: Path, backend: Backend, handle: Handle,
                 hashed_now: bool, dropped: tuple[str, ...], judged=None):
    """The verification pipeline (in the audit pool's worker process), with the checks the job's policy sets for this
    kind of compute; for an untrusted executor, its signature and its openings of the challenge.

    The job's code (its evaluator, its own recipe) runs from the bundle the broker sent, extracted
    afresh into the job's `verify/` workspace with its sha256 checked, with the virtualenv the broker
    built for its requirements: never from the attempt's work dir, which the job could rewrite."""
    from trainmaster.verify import pipeline

    offer = Offer.model_validate_json(attempt.offer_json)
    checks = checks_for(ctx.policy, ctx.spec, offer)
    if judged is not None and not judged.replay and "replay" in checks:
        checks.remove("replay")  # the refereed tier: its pair's agreement, or one replayed segment, stands for it
    signature, open_segments = None, None
    if not offer.trusted and isinstance(backend, RunsUntrusted) and makes_commitment(ctx.spec):
        try:
            signature = (await retried(backend.signed_commitment, handle)).signature
        except BackendError as exc:  # the executor sent none: the pipeline rejects an unsigned commitment
            ctx.log("error", {"message": f"no signed commitment: {exc}"}, attempt.id)
    if "replay" in checks and isinstance(backend, KeepsSegments):
        open_segments = SegmentOpener(backend, handle, paths.job_dir(ctx.id) / "openings" / str(attempt.n),
                                      trusted=offer.trusted, deadline_s=ctx.policy.verification.challenge_deadline_s)
    workspace = paths.job_dir(ctx.id) / "verify"
    await asyncio.to_thread(shutil.rmtree, workspace, True)  # what a verification that died left (we hold the lock)
    request = pipeline.Attempt(
        job_id=ctx.id, attempt_id=attempt.id, outputs=outputs, bundle_sha256=ctx.job.bundle_sha256,
        spec=ctx.spec, trusted=offer.trusted, recorded_outputs=tuple(ctx.store.outputs(attempt.id)),
        bundle=await retried(shared_bundles.fetched, ctx.job.bundle_sha256, ctx.parts.progress), workspace=workspace,
        envs_dir=ctx.parts.backends.envs_dir(), exact_replay=offer.trusted and backend.exact_replay,
        hotkey=attempt.executor_hotkey, signature=signature,
        outputs_hashed=hashed_now, seed=attempt.seed, previous_metrics=previous_metrics(ctx.store, ctx.job),
        dropped=dropped, referee=judged.evidence if judged is not None else None,
        pair=tuple(a.id for a in pairs.members(ctx.store, attempt) if a.id != attempt.id),
        tier=verification_tier(ctx.spec, ctx.policy),
    )
    settings = ctx.policy.verification
    return await verifying.verify(
        request, checks=checks, db_path=ctx.store.path, opener=open_segments,
        audit_settings=pipeline.AuditSettings(calibration_dir=paths.home() / "calibration", tau=settings.tau),
    )


def final_verdict(ctx: JobContext, attempt: Attempt):
    """The attempt's stored verdict when it is final (accepted or rejected): a verdict is reached once."""
    from trainmaster.verify.records import VerdictStore

    verdicts = VerdictStore(ctx.store.path)
    try:
        verdict = verdicts.latest(ctx.id, attempt.id)
    finally:
        verdicts.close()
    return verdict if verdict is not None and verdict.outcome in ("accepted", "rejected") else None


def checks_for(policy: Policy, spec: JobSpec, offer: Offer) -> list[str]:
    """The checks an attempt gets: the policy's for its kind of compute, with the replay audit added
    for a trusted run when the spec says `replay_audit: always`, or dropped when it says `never`
    (an untrusted executor is always audited: its work is paid for only through the audit, unless the job opts
    into outcome-only trust, broker/auditability.py)."""
    settings = policy.verification
    checks = list(settings.trusted if offer.trusted else untrusted_checks(spec, settings.untrusted))
    wanted = spec.verification.replay_audit
    if offer.trusted and wanted == "always" and "replay" not in checks:
        checks.append("replay")  # the pipeline runs its checks in its own order
    elif offer.trusted and wanted == "never" and "replay" in checks:
        checks.remove("replay")
    return checks


def previous_metrics(store: Store, job: Job) -> dict[str, float] | None:
    """The metrics the broker's own outcome check measured for the job's accepted predecessor (its stored verdict,
    never what that run reported about itself), for the no-regression rule (10 %): the newest accepted attempt of
    an earlier job of the same name. None when it has none (its first run, or a predecessor accepted without an
    outcome check)."""
    from trainmaster.verify.records import VerdictStore

    earlier = [a for a, _ in store.accepted_runs(job.name, 2) if a.job_id != job.id]
    if not earlier:
        return None
    verdicts = VerdictStore(store.path)
    try:
        verdict = verdicts.latest(earlier[0].job_id, earlier[0].id)
    finally:
        verdicts.close()
    outcome = (verdict.evidence.get("outcome") or {}) if verdict is not None else {}
    return dict(outcome["metrics"]) if outcome.get("metrics") else None


class SegmentOpener:
    """What the verification pipeline (in the audit pool) has the broker do, through broker/segment_channel.py, to
    have the executor open the challenged segments: the backend's `open_segments`, on the broker's event loop.

    An untrusted executor answers its challenge or forfeits: one that refuses, sends a short or altered
    stream, stays unreachable after the bounded retries, or has not answered by the policy's
    `challenge_deadline_s` is rejected (unpaid, banned) — going silent once it has seen which segments
    are challenged must never be better for it than being caught. Only a fault on our own side (a full
    disk) leaves the attempt unverifiable. On trusted compute every failure to open is ours.
    """

    def __init__(self, backend: KeepsSegments, handle: Handle, dest: Path, *, trusted: bool, deadline_s: float):
        self.backend, self.handle, self.dest = backend, handle, dest
        self.trusted, self.deadline_s = trusted, deadline_s

    async def __call__(self, indices: list[int]) -> Path:
        """The folder the openings were written to."""
        from trainmaster.verify.errors import VerificationError

        call = retried(self.backend.open_segments, self.handle, sorted(indices), self.dest)
        blame = "cannot_verify" if self.trusted else "rejected"
        try:
            return await asyncio.wait_for(call, self.deadline_s)
        except asyncio.TimeoutError:
            raise VerificationError(f"the executor did not open the challenged segments {indices} within "
                                    f"{self.deadline_s:g} s", kind=blame) from None
        except LocalEnvironmentError as exc:
            raise VerificationError(f"opening the challenged segments {indices} failed on our side: {exc}",
                                    kind="cannot_verify") from exc
        except TransientBackendError as exc:
            raise VerificationError(f"the executor did not answer its challenge (segments {indices}) after "
                                    f"{ATTEMPTS} tries: {exc}", kind=blame) from exc
        except BackendError as exc:
            raise VerificationError(f"the executor did not open the challenged segments {indices}: {exc}",
                                    kind=blame) from exc
