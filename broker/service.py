"""The broker: submit → plan → dispatch → watch → collect (fetch, verify, share, promote) → settle, resumable
from any state. A façade over the stages of a job's life (broker/stages/, one module each), which work on the parts it
holds (`stages.job_context.Parts`: the store, the backends as configured, policies, ledgers, executors, locks).

Every step reads the state from the state database, does its work, and records the new state; `advance` walks a
job as far as it can go right now. Any process (the CLI that submitted, the daemon's reconciler) can call it after a
crash, so no job is lost: a dispatch that died before recording its handle finds its run again (`Backend.submit` is
idempotent on the attempt id), and a settle that died half-way is redone without recording anything twice. After
the verdict, an untrusted executor is paid and told its conclusion exactly once (broker/money/settlement.py).

Everything here is a coroutine: the CLI calls `asyncio.run` once at its edge and the daemon runs the same calls on
its own loop. Work that would block the loop (bundling, hashing) runs in worker threads; the verification pipeline
with its replay audit runs in a process pool (broker/verifying.py).

A job is planned once, at submit, under the policy as it was then (both are stored with the job); offers are
gathered again to re-plan after a failed attempt, and to quote the planned offer again when its price no longer
holds at dispatch (`Offer.valid_until`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

from trainmaster.backends.base import Backend, Offer, Progress
from trainmaster.broker import paths, states
from trainmaster.broker.backend_set import BackendSet
from trainmaster.broker.planning.planner import Plan
from trainmaster.broker.planning.policy import Policy
from trainmaster.broker.resume_point import ResumePoint
from trainmaster.broker.stages import (
    advancing, cancelling, collect, ledger_moves, log_following, offer_rounds, resuming, submission,
)
from trainmaster.broker.stages.job_context import Parts
from trainmaster.broker.store import Attempt, Job, Store
from trainmaster.jobs.spec import JobSpec
from trainmaster.wallet.payments import PaymentSender
from trainmaster.wallet.rates import RateProvider


class Broker:
    """The broker over one state database. `backends` replaces registry backends by name (tests); `progress` is
    drawn while outputs and bundles are fetched, `upload_progress` while a bundle is uploaded at submit."""

    def __init__(self, store: Store | None = None, backends: dict[str, Backend] | None = None,
                 progress: Progress | None = None, sender: PaymentSender | None = None,
                 upload_progress: Progress | None = None):
        self.parts = Parts(store or Store(paths.state_db()), BackendSet(backends, upload_progress),
                           progress=progress, sender=sender)

    @property
    def store(self) -> Store:
        return self.parts.store

    @property
    def progress(self) -> Progress | None:
        return self.parts.progress

    @progress.setter
    def progress(self, value: Progress | None) -> None:
        self.parts.progress = value  # the CLI's status line draws a fetch while it is shown (broker/cli/live.py)

    @property
    def offer_rounds(self) -> int:
        """How many times offers were gathered from the backends (one per plan)."""
        return self.parts.offer_rounds

    def close(self) -> None:
        self.parts.close()

    # policies and backends

    def policy(self, job: Job) -> Policy:
        """The policy the job was submitted under (its stored snapshot)."""
        return self.parts.policy(job)

    def spec(self, job: Job) -> JobSpec:
        return JobSpec.model_validate_json(job.spec_json)

    def backend(self, name: str, policy: Policy) -> Backend:
        """The backend `name` with its effective configuration under `policy` (broker/backend_set.py)."""
        return self.parts.backends.backend(name, policy)

    def backend_of(self, job: Job, attempt: Attempt) -> Backend | None:
        """The backend an attempt ran on, as its job's policy configures it; None when this version has none by
        that name."""
        return self.parts.backend_of(job, attempt)

    def rates(self, policy: Policy) -> RateProvider | None:
        return self.parts.backends.rates(policy)

    def use_backend_configs(self, configs: dict) -> None:
        """backends.yaml as the daemon last read and validated it (broker/daemon/config_watch.py), over the file."""
        self.parts.backends.use_configs(configs)

    @property
    def settlement(self):
        """The settling stage after a verdict (broker/money/settlement.py)."""
        return self.parts.settlement

    @property
    def executors(self):
        """Bans and reputation of the executors we do not control (broker/executors.py)."""
        return self.parts.executors

    # planning and submitting

    async def plan(self, spec: JobSpec, policy: Policy, blocked: frozenset[str] = frozenset()) -> Plan:
        """Offers from every enabled backend, one chosen by the policy (broker/stages/offer_rounds.py)."""
        return await offer_rounds.plan(self.parts, spec, policy, blocked)

    def budget_refusal(self, spec: JobSpec, policy: Policy, plan_: Plan) -> str | None:
        """Why dispatching the plan's choice would be refused by a budget now (what `submit` would say)."""
        return offer_rounds.budget_refusal(self.parts, spec, policy, plan_)

    def start_preview(self, spec: JobSpec, policy: Policy, offer: Offer) -> str | None:
        """Whether a job planned on `offer` would start now or wait in the queue (None: it always starts)."""
        return offer_rounds.start_preview(self.parts, spec, policy, offer)

    async def prepare(self, spec_path: Path, policy_name: str = "default") -> submission.Prepared:
        """Check, plan and hash without writing anything (raises FileError, PlanError, BundleError)."""
        return await submission.prepare(self.parts, spec_path, policy_name)

    async def submit(self, spec_path: Path, policy_name: str = "default", *, origin: dict | None = None) -> Job:
        """Plan, bundle, record and dispatch. Nothing is recorded unless the spec, plan and bundle are good.
        `origin` (who asked: a trigger's fire and its idempotency key) is kept in the job's first event."""
        return await self.advance(await submission.record(self.parts, spec_path, policy_name, origin=origin))

    # the state machine

    async def advance(self, job_id: str) -> Job:
        """Move a job as far as it can go now (broker/stages/advancing.py); safe from any process at any time."""
        return await advancing.advance(self.parts, job_id)

    async def settle_with_executors(self, job_id: str) -> None:
        """Pay and conclude the job's untrusted attempts that have a verdict (broker/stages/ledger_moves.py)."""
        await ledger_moves.settle_with_executors(self.parts, job_id)

    async def promote_pending(self) -> None:
        """Carry on the promotions left pending (broker/promotion/); what fails stays pending for the next pass."""
        await collect.promote(self.store)

    async def wait(self, job_id: str, *, poll_s: float = 0.2, timeout_s: float | None = None) -> Job:
        """Advance the job until it ends or waits for the user (or `timeout_s` passed)."""
        deadline = time.time() + timeout_s if timeout_s else None
        while True:
            job = await self.advance(job_id)
            if job.state in states.JOB_ENDS | states.WAITING or (deadline and time.time() > deadline):
                return job
            await asyncio.sleep(poll_s)

    # user actions on a job

    async def verify_again(self, job_id: str) -> Job:
        """Run the checks again on the job's unverified attempt (after the user fixed what stopped them)."""
        return await self.advance(await collect.verify_again(self.parts, job_id))

    async def resume_point(self, job: Job) -> ResumePoint:
        """Where `resume` would start the job from (broker/stages/resuming.py)."""
        return await resuming.point(self.parts.of(job))

    async def resume(self, job_id: str, *, max_hours: float | None = None, max_usd: str | None = None) -> Job:
        """Start a failed or cancelled job again on its planned offer, from the last committed segment an earlier
        attempt left, its `max_hours` and `max_usd` raised when given (NothingToDo when they do not raise them)."""
        return await self.advance(await resuming.restart(self.parts, job_id, max_hours=max_hours, max_usd=max_usd))

    async def cancel(self, job_id: str) -> Job:
        """Cancel an unfinished job, and stop what its ended attempts still run (broker/stages/cancelling.py)."""
        return await cancelling.cancel(self.parts, job_id)

    async def logs(self, job_id: str, *, follow: bool = False) -> AsyncIterator[str]:
        """The latest attempt's log from its start; with `follow`, until the job ends (across fallbacks)."""
        async for text in log_following.logs(self.parts, job_id, follow=follow):
            yield text
