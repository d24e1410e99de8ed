"""The broker: submit → plan → dispatch → watch → fetch → verify → settle, resumable from any state.

Every step reads the state from SQLite, does its work, and records the new state; `advance`
walks a job as far as it can go right now. Any process (the CLI that submitted, a later
`trainmaster status`, the daemon) can call it after a crash, so no job is lost: a dispatch
that died before recording its handle finds its run again (`Backend.submit` is idempotent on the
attempt id), and a settle that died half-way is redone without recording anything twice. After the
verdict, an untrusted executor is paid and told its conclusion exactly once (broker/settlement.py).

Everything here is a coroutine: the CLI calls `asyncio.run` once at its edge and the daemon runs
the same calls on its own loop. Work that would block the loop (bundling, hashing) runs in worker
threads; the verification pipeline with its replay audit runs in a process pool (broker/verifying.py).

A job is planned once, at submit, under the policy as it was then (both are stored with the job);
offers are gathered again to re-plan after a failed attempt, and to quote the planned offer again
when its price no longer holds at dispatch (`Offer.valid_until`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import hashlib
import logging
import secrets
import shutil
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from trainmaster.backends.base import (
    AttemptContext, Backend, BackendError, Cause, Cost, Handle, LocalEnvironmentError, Offer, OfferSet, Phase,
    Progress,
    TransientBackendError,
)
from trainmaster.backends.features import (
    AllocatesMachine, CheckpointRef, KeepsSegments, ResumesFromCheckpoints, RunsUntrusted,
)
from trainmaster.backends.retry import ATTEMPTS, retried
from trainmaster.broker import (
    budget_wait, cost_cap, deadlines, failures, paths, readiness, shared_bundles, shared_outputs, shared_storage,
    states, verifying,
)
from trainmaster.broker.no_fallback import no_fallback_reason
from trainmaster.broker.agreed_price import agreed
from trainmaster.broker.auditability import auditable_backends, job_fault, makes_commitment, untrusted_checks
from trainmaster.broker.backend_config import configured
from trainmaster.broker.estimate import own_estimate, past_run
from trainmaster.broker.executor_text import attempt_log
from trainmaster.broker.executors import Executors, ban_rejected
from trainmaster.broker.offer_request import current_rate, offer_request, provider_for
from trainmaster.broker.planner import Plan, PlanError, gather_offers, plan, reference_hours
from trainmaster.broker.plans import StoredPlan, requote
from trainmaster.broker.policy import Policy, load_policy
from trainmaster.broker.predecessor import previous_metrics
from trainmaster.broker.resuming import ResumePoint, raised_limits, resume_point
from trainmaster.broker.settlement import Settlement
from trainmaster.broker.store import Attempt, Job, Store
from trainmaster.jobs import bundle as bundles
from trainmaster.jobs import outputs as kept_outputs
from trainmaster.jobs.launch_checks import launch_problems
from trainmaster.jobs.spec import JobSpec, LoadedSpec, load_spec
from trainmaster.storage import statedb
from trainmaster.wallet.ledger import BudgetExceeded, Ledger
from trainmaster.wallet.rates import Rate, RateProvider
from trainmaster.wallet.payments import PaymentOrder, PaymentSender

HISTORY_RUNS = 20  # newest accepted runs of a class that estimate its runtime
MIN_ATTEMPTS_FOR_RATE = 5  # ended attempts of a backend before its failure rate prices risk
MAX_FAILURE_RATE = 0.99  # a backend that failed every time is priced as nearly sure to fail (the planner needs < 1)
LOG_POLL_S = 0.2
WATCH_S = 1.0  # while `logs -f` follows a running job, it is watched (its cost cap checked) this often


@dataclass(frozen=True)
class Prepared:
    """A spec checked, bundled in memory and planned: what `submit --dry-run` shows."""

    loaded: LoadedSpec
    policy: Policy
    plan: Plan
    bundle: bundles.BundleInfo
    warnings: tuple[str, ...] = ()
    """What will happen to the run's outputs on the chosen offer, and code lines that may write pickles."""
    budget: str | None = None
    """Why a budget would refuse the dispatch now (submit would fail the job with this reason)."""
    start: str | None = None
    """Whether the job would start now or wait in the queue (backends that allocate a machine)."""



def left_out_warning(left_out: tuple[str, ...] | list[str]) -> list[str]:
    """The warning for the likely secrets a bundle left out (none when nothing was)."""
    if not left_out:
        return []
    return [f"left out of the bundle as likely secrets: {', '.join(left_out)} "
            f"(a `!name` line in {bundles.IGNORE_FILE} sends one anyway)"]

class Broker:
    """The broker over one state database. `backends` replaces registry backends by name (tests)."""

    def __init__(self, store: Store | None = None, backends: dict[str, Backend] | None = None,
                 progress: Progress | None = None, sender: PaymentSender | None = None,
                 upload_progress: Progress | None = None):
        self.store = store or Store(paths.state_db())
        self.progress = progress
        self.upload_progress = upload_progress
        self._sender = sender
        """The payment sender given (tests); None: the one backends.yaml names (`broker.payment_sender`)."""
        self._settlement: Settlement | None = None
        self._given = dict(backends or {})
        self._backends: dict[tuple[str, str], Backend] = {}
        self._policies: dict[str, Policy] = {}
        self._ledgers: dict[str, Ledger] = {}
        self._backend_configs: dict | None = None
        self._executors: Executors | None = None
        self._rate_providers: dict[str, RateProvider | None] = {}
        self._session_locks = None
        """The server's session locks on jobs (`_job_locked`), when the state is on PostgreSQL."""
        self.offer_rounds = 0
        """How many times offers were gathered from the backends (one per plan)."""

    def close(self) -> None:
        for ledger in self._ledgers.values():
            ledger.close()
        if self._session_locks is not None:
            self._session_locks.close()
        self.store.close()

    def _job_locked(self, job_id: str):
        """The job's lock, so two brokers never dispatch or settle it at once: a file lock beside a SQLite state
        file (one host), a session advisory lock of the database server when the state is on one (any host)."""
        if not statedb.is_server(self.store.path):
            return _locked(paths.job_dir(job_id) / ".lock")
        if self._session_locks is None:
            from trainmaster.storage.dialects import postgresql

            self._session_locks = postgresql.SessionLocks(self.store.path)
        return self._session_locks.hold(f"job:{job_id}")

    # policies and backends

    def policy(self, job: Job) -> Policy:
        """The policy the job was submitted under (its stored snapshot), parsed once per process per distinct
        snapshot: keyed by the snapshot, so a daemon's cache grows with the policies, not with the jobs."""
        key = job.policy_json or f"name:{job.policy}"
        if key not in self._policies:
            self._policies[key] = (Policy.model_validate_json(job.policy_json) if job.policy_json
                                   else load_policy(job.policy))  # a job stored before snapshots existed
        return self._policies[key]

    def backend(self, name: str, policy: Policy) -> Backend:
        """The backend `name`, with its effective configuration (`broker.backend_config`: backends.yaml, the
        broker's defaults, the policy's overrides of the fields its config model declares overridable).

        Instances are cached by their configuration, so two policies with different power models
        never share a local backend in a long-lived process.
        """
        if name in self._given:
            found = self._given[name]
        else:
            from trainmaster.backends.registry import backend_class

            cls = backend_class(name)
            config = configured(self._configs()[name], policy).config
            key = (name, config.model_dump_json())
            if key not in self._backends:
                self._backends[key] = cls(config)
            found = self._backends[key]
        found.rates = self.rates(policy)  # the broker's rate provider, injected
        found.progress = self.upload_progress  # the CLI's transfer bar, for a bundle uploaded at submit
        return found

    def backend_of(self, job: Job, attempt: Attempt) -> Backend | None:
        """The backend an attempt ran on, as its job's policy configures it; None when this version has no
        backend by that name (an attempt of a backend since removed, or one only a test provided)."""
        from trainmaster.backends.registry import UnknownBackend

        try:
            return self.backend(attempt.backend, self.policy(job))
        except UnknownBackend:
            return None

    def rates(self, policy: Policy) -> RateProvider | None:
        """The TAO/USD rate provider of the policy (one per rate setting, kept for the process)."""
        key = policy.tao_rate.model_dump_json()
        if key not in self._rate_providers:
            self._rate_providers[key] = provider_for(policy)
        return self._rate_providers[key]

    def use_backend_configs(self, configs: dict) -> None:
        """backends.yaml as the daemon last read and validated it (broker/daemon/config_watch.py), over the file."""
        self._backend_configs = configs

    def _configs(self) -> dict:
        """backends.yaml from the user's config dir, read once per broker (FileError when invalid)."""
        if self._backend_configs is None:
            from trainmaster.backends.config import load_configs

            self._backend_configs = load_configs(paths.config_dir())
        return self._backend_configs

    def _effective_configs(self, policy: Policy) -> dict:
        """Each backend's configuration as jobs under `policy` use it (what `backend` builds them with)."""
        return {name: configured(config, policy).config for name, config in self._configs().items()}

    def _enabled(self, spec: JobSpec, policy: Policy) -> dict[str, Backend]:
        from trainmaster.backends.registry import BACKENDS

        cls = policy.for_class(spec.workload)
        names = [n for n in (cls.constraints.allowed_backends or cls.chain) if n in BACKENDS or n in self._given]
        return {n: self.backend(n, policy) for n in names}

    def budget_refusal(self, spec: JobSpec, policy: Policy, plan_: Plan) -> str | None:
        """Why dispatching the plan's choice would be refused by a budget now (what `submit` would say)."""
        if plan_.chosen is None:
            return None
        offer = plan_.chosen.offer
        with Ledger(self.store.db, budgets=policy.budgets) as ledger:
            refused = ledger.refusal(backend=offer.backend, workload=spec.workload, project=spec.project,
                                     micro_usd=plan_.chosen.expected_micro_usd)
        return budget_wait.reason(refused) if refused else None

    async def plan(self, spec: JobSpec, policy: Policy, blocked: frozenset[str] = frozenset()) -> Plan:
        """Gather offers from every enabled backend (once) and choose by the policy; the offers of a banned
        hotkey or coldkey (`trainmaster executors ls`) are blocked like failed ones, in every job."""
        self.offer_rounds += 1
        rate, rate_problem = current_rate(self.rates(policy))
        request = offer_request(spec, policy, rate)
        enabled, refused = auditable_backends(spec, policy, self._enabled(spec, policy))  # refused: never asked
        unready = readiness.unready([n for n in enabled if n not in self._given], self._effective_configs(policy))
        offer_sets: list[OfferSet] = await gather_offers(request, {n: b for n, b in enabled.items() if n not in unready},
                                                         valid_s=policy.offers.valid_s,
                                                         rate_max_age_s=policy.tao_rate.max_age_s)
        offer_sets += [*readiness.as_offer_sets(unready), *refused]
        hotkeys, coldkeys = self.executors.banned()
        banned = frozenset(banned_offers(offer_sets, hotkeys, coldkeys)) if hotkeys or coldkeys else frozenset()
        history, failure_rates = learned(self.store.ended_attempts())
        result = plan(spec, policy, offer_sets, blocked=blocked, banned=banned, history=history,
                      failure_rates=failure_rates, data_bytes=request.data_bytes, total_steps=request.total_steps,
                      own=own_estimate(spec, [past_run(a, spec_json) for a, spec_json
                                              in self.store.accepted_runs(spec.name, HISTORY_RUNS)]))
        result.notes += [rate_problem] if rate_problem else []
        return result

    def start_preview(self, spec: JobSpec, policy: Policy, offer: Offer) -> str | None:
        """Whether a job planned on `offer` would start now or wait in the queue (None: the backend
        does not allocate a machine, so it always starts)."""
        backend = self.backend(offer.backend, policy)
        if not isinstance(backend, AllocatesMachine):
            return None
        return self.store.start_preview(offer.backend, lambda held: backend.fit(spec, held))

    # submit

    async def _planned(self, spec_path: Path, policy_name: str) -> tuple[LoadedSpec, Policy, Plan]:
        """The spec checked and planned under the policy (raises FileError, PlanError)."""
        from trainmaster.jobs.yamlfile import FileError

        loaded = load_spec(spec_path)
        if problems := launch_problems(loaded):
            raise FileError(loaded.path, problems)
        if paths.overlaps_home(loaded.code_dir):
            raise FileError(loaded.path, [f"{loaded.path}: code: {loaded.code_dir} overlaps trainmaster's home "
                                          f"{paths.home()} (its state, job environments and secrets would be bundled); "
                                          "point code: at the job's own folder"])
        policy = load_policy(policy_name)
        result = await self.plan(loaded.spec, policy)
        if result.chosen is None:
            raise PlanError(result)
        if "replay" in checks_for(policy, loaded.spec, result.chosen.offer):
            from trainmaster.verify.recipe_run import precision_refusal, processes_refusal

            if refusal := processes_refusal(loaded.spec):  # never dispatch a run its audit could not replay
                raise FileError(loaded.path, [f"{loaded.path}: resources.processes: {refusal}"])
            if refusal := precision_refusal(loaded.spec):
                raise FileError(loaded.path, [f"{loaded.path}: precision: {refusal}"])
        return loaded, policy, result

    async def prepare(self, spec_path: Path, policy_name: str = "default") -> Prepared:
        """Check, plan and hash without writing anything (raises FileError, PlanError, BundleError)."""
        loaded, policy, result = await self._planned(spec_path, policy_name)
        info = await asyncio.to_thread(bundles.bundle_digest, loaded.code_dir, loaded.spec.canonical_json(),
                                       max_bytes=_max_bundle(loaded.spec))
        from trainmaster.verify.output_kinds import dry_run_warnings

        offer = result.chosen.offer
        warnings = await asyncio.to_thread(dry_run_warnings, loaded.code_dir, trusted=offer.trusted, where=offer.backend,
                                           max_bundle_bytes=_max_bundle(loaded.spec))
        warnings = [*left_out_warning(info.left_out), *warnings]
        return Prepared(loaded=loaded, policy=policy, plan=result, bundle=info, warnings=tuple(warnings),
                        budget=self.budget_refusal(loaded.spec, policy, result),
                        start=self.start_preview(loaded.spec, policy, offer))

    async def submit(self, spec_path: Path, policy_name: str = "default", *, origin: dict | None = None) -> Job:
        """Plan, bundle, record and dispatch. Nothing is recorded unless the spec, plan and bundle are good.
        `origin` (who asked: a trigger's fire and its idempotency key) is kept in the job's first event."""
        shared_storage.check_database()
        loaded, policy, result = await self._planned(spec_path, policy_name)
        info = await asyncio.to_thread(bundles.build_bundle, loaded.code_dir, loaded.spec.canonical_json(),
                                       paths.bundles_dir(), max_bytes=_max_bundle(loaded.spec))
        await retried(shared_bundles.publish, info.sha256, self.upload_progress)
        job_id = f"{loaded.spec.name}-{secrets.token_hex(4)}"
        self.store.create_job(
            job_id=job_id, name=loaded.spec.name, workload=loaded.spec.workload, project=loaded.spec.project,
            spec_json=loaded.spec.model_dump_json(), spec_path=str(loaded.path), bundle_sha256=info.sha256,
            policy=policy_name, policy_json=policy.model_dump_json(),
            detail={"bundle_bytes": info.size, "files": info.files, "left_out": list(info.left_out),
                    **({"origin": origin} if origin else {})},
        )
        self._policies[policy.model_dump_json()] = policy
        self._record_plan(job_id, result, seq=1)
        return await self.advance(job_id)

    def _record_plan(self, job_id: str, result: Plan, *, seq: int) -> None:
        stored = StoredPlan.of(result, seq)
        self.store.set_plan(job_id, stored.model_dump_json(), detail=stored.event())

    # the state machine, driven from whatever state is recorded

    async def advance(self, job_id: str) -> Job:
        """Move a job as far as it can go now; safe to call from any process at any time. A queued job
        first has the jobs that hold the machine brought up to date, so a run that ended frees its place.
        An untrusted attempt with a verdict is then settled with its executor (broker/settlement.py)."""
        seen = self.store.job(job_id)
        if seen.state == "queued":
            await self._advance_holders()
        job = await self._advance(job_id, seen)
        await self._settle_with_executors(job_id)
        return job

    async def _advance_holders(self) -> None:
        for holder in self.store.holders():
            try:
                await self._advance(holder)
            except failures.Waiting:
                pass  # recorded on the attempt, with what to fix
            except Exception as exc:  # noqa: BLE001 — recorded on that job, retried by the next command
                self.store.log_event(holder, "error", {"message": f"{type(exc).__name__}: {exc}"})

    async def _advance(self, job_id: str, seen: Job | None = None) -> Job:
        """Advance the job; `seen`: its row as the caller just read it (an ended job is left there). Under
        its lock the row is read again, and again only after a step that may have moved it (a watch that
        wrote nothing did not)."""
        job = seen or self.store.job(job_id)
        if job.state in states.JOB_ENDS:
            return job
        async with self._job_locked(job_id):
            job = self.store.job(job_id)
            if job.cancel_requested_at is not None and job.state not in states.JOB_ENDS:
                await self._cancel_now(job)  # what a process that died while cancelling left
                return self.store.job(job_id)
            if job.state == "submitted" or (job.state == "planned" and not job.plan_json):
                await self._replan(job)  # recorded, but the process died before its plan was
                job = self.store.job(job_id)
            if job.state in ("planned", "queued"):
                await self._dispatch(job)
                job = self.store.job(job_id)
            for attempt in self.store.attempts(job_id):
                if attempt.state not in states.ATTEMPT_ENDS | states.WAITING:
                    written = self.store.transactions
                    await self._watch(job, attempt)
                    if self.store.transactions != written:  # else the job is as it was read under its lock
                        job = self.store.job(job_id)
        return job

    async def refresh(self) -> None:
        """Advance every unfinished job (what each CLI command does first).

        A job that cannot move now (a backend down, a ledger conflict) gets an `error` event and is
        tried again next time; it never stops the others from being brought up to date. Queued jobs
        come last, first in the queue first, so they start in order on what the others freed.
        """
        moving = set(states.JOB_TRANSITIONS) - states.JOB_ENDS - {"queued"}
        for job in self.store.jobs(states_in=moving, limit=1000) + self.store.queued_jobs():
            try:
                await self._advance(job.id)
            except failures.Waiting:
                pass  # recorded on the attempt, with what to fix
            except Exception as exc:  # noqa: BLE001 — recorded on the job, retried by the next command
                self.store.log_event(job.id, "error", {"message": f"{type(exc).__name__}: {exc}"})
        for job_id in dict.fromkeys(job_id for job_id, _ in self.settlement.pending()):
            try:
                await self._settle_with_executors(job_id)
            except Exception as exc:  # noqa: BLE001 — recorded on the job, retried by the next command
                self.store.log_event(job_id, "error", {"message": f"{type(exc).__name__}: {exc}"})
        await self._promote()

    async def wait(self, job_id: str, *, poll_s: float = 0.2, timeout_s: float | None = None) -> Job:
        deadline = time.time() + timeout_s if timeout_s else None
        while True:
            job = await self.advance(job_id)
            if job.state in states.JOB_ENDS | states.WAITING or (deadline and time.time() > deadline):
                return job
            await asyncio.sleep(poll_s)

    def spec(self, job: Job) -> JobSpec:
        return JobSpec.model_validate_json(job.spec_json)

    def _blocked(self, job: Job) -> frozenset[str]:
        attempts = self.store.attempts(job.id)
        return frozenset(Offer.model_validate_json(a.offer_json).key for a in attempts
                         if a.state in ("failed", "rejected")) | readiness.blocked_backends(attempts,
                                                                                           self.store.events(job.id))

    @property
    def settlement(self) -> Settlement:
        """The settling stage after a verdict: payments sent and conclusions delivered, exactly once."""
        if self._settlement is None:
            from trainmaster.broker.payment_sender import configured_sender

            sender = self._sender or configured_sender(self._configs(), self.store.db)
            self._settlement = Settlement(self.store.db, self.store.path, key_path=paths.home() / "keys" / "broker.key",
                                          sender=sender)
        return self._settlement

    async def _settle_with_executors(self, job_id: str) -> None:
        """Settle each of the job's untrusted attempts that has a verdict and no acknowledged conclusion:
        its payment sent, its conclusion delivered. A failure (the executor unreachable, a bad
        countersignature) is recorded on the job and tried again by the next command."""
        pending = self.settlement.pending(job_id)
        if not pending:
            return
        async with self._job_locked(job_id):
            job = self.store.job(job_id)
            for _, attempt_id in pending:
                attempt = self.store.attempt(attempt_id)
                backend = self.backend(attempt.backend, self.policy(job))
                if not isinstance(backend, RunsUntrusted) or not attempt.handle_json:
                    continue
                charge = self._ledger(job).entry(f"charge:{attempt.id}")
                try:
                    await self.settlement.conclude(job, attempt, backend, Handle.model_validate_json(attempt.handle_json),
                                                   amount_rao=charge.rao if charge else 0)
                except BackendError as exc:
                    self.store.log_event(job_id, "error", {"message": f"settling attempt {attempt.n} with its "
                                                                      f"executor: {exc}"}, attempt.id)

    @property
    def executors(self) -> Executors:
        """Bans and reputation of the executors we do not control, across jobs."""
        if self._executors is None:
            self._executors = Executors(self.store.db)
        return self._executors

    async def _replan(self, job: Job, after: str | None = None) -> None:
        """A new plan after a failed attempt (offers gathered again, the failed ones and the executors
        caught cheating blocked)."""
        result = await self.plan(self.spec(job), self.policy(job), blocked=self._blocked(job))
        if result.chosen is None:
            reason = result.explain_failure()
            if after:  # the attempt's own reason first: that is what the user must fix
                reason = no_fallback_reason(after, result, job.policy)
            self.store.move_job(job.id, "failed", reason=reason)
            return
        seq = StoredPlan.model_validate_json(job.plan_json).seq + 1 if job.plan_json else 1
        self._record_plan(job.id, result, seq=seq)

    async def _dispatch(self, job: Job) -> None:
        """Claim the machine (a backend that allocates one: else the job waits queued), reserve the
        planned cost and start an attempt on the planned offer (no second planning)."""
        stored = StoredPlan.model_validate_json(job.plan_json)
        spec, n = self.spec(job), self.store.next_attempt_number(job.id)
        if cost_cap.remaining(spec, self.store.attempts(job.id), time.time()) == 0:
            self.store.move_job(job.id, "failed", reason=cost_cap.reason(
                spec, cost_cap.spent(self.store.attempts(job.id), time.time())))
            return
        stored = await self._requoted(job, stored)
        if stored is None:
            return  # nothing left to dispatch on: the job failed with the plan's reasons
        ledger = self._ledger(job)
        if self._budget_stands_in_the_way(job, ledger, ledger.refusal(
                backend=stored.offer.backend, workload=job.workload, project=job.project,
                micro_usd=stored.expected_micro_usd)):
            return  # waits for its budget (queued), or failed by it: before a machine is claimed
        offer = self._claimed(job, spec, stored.offer, n)
        if offer is None:
            return  # queued
        key = f"reserve:{job.id}.{n}.p{stored.seq}"
        self._release_orphans(job, ledger, keep=key)
        price = None if offer.trusted else agreed(offer, stored.hours)  # what an untrusted executor's work is paid
        try:
            ledger.reserve(key, job_id=job.id, backend=offer.backend, workload=job.workload, project=job.project,
                           micro_usd=stored.expected_micro_usd, rao=price.rao if price else 0,
                           rate_micro_usd_per_tao=price.rate_micro_usd_per_tao if price else None,
                           detail={"offer": offer.key, "hours": stored.hours,
                                   **({"agreed_micro_usd": price.micro_usd} if price else {})})
        except BudgetExceeded as exc:
            self._budget_stands_in_the_way(job, ledger, exc, attempt_id=f"{job.id}.{n}")
            return
        if job.reason and job.reason.startswith(budget_wait.WAITING):
            self.store.budget_wait_over(job.id, budget_wait.WAITING)
        seed, nonce = self.spec(job).seed, None
        if not offer.trusted:  # a fresh S_0 per attempt: another attempt's run never verifies as this one
            nonce = secrets.token_hex(16)
            seed = attempt_seed(seed, nonce)
        attempt = self.store.create_attempt(job.id, backend=offer.backend, offer_json=offer.model_dump_json(),
                                            reserve_key=key, seed=seed, detail={"seed_nonce": nonce} if nonce else None)
        await self._start(job, attempt)

    def _budget_stands_in_the_way(self, job: Job, ledger: Ledger, refused: BudgetExceeded | None, *,
                                  attempt_id: str | None = None) -> bool:
        """A budget refusing the job's reservation: it waits queued when reservations stand in the way, fails
        when the spend does (broker/budget_wait.py); False when nothing refused it."""
        if refused is None:
            return False
        if budget_wait.waits(refused):
            self.store.wait_for_budget(job.id, budget_wait.reason(refused), attempt_id=attempt_id)
        else:
            self.store.move_job(job.id, "failed", reason=budget_wait.reason(refused))
        return True

    async def _requoted(self, job: Job, stored: StoredPlan) -> StoredPlan | None:
        """The stored plan, with its offer quoted again when its price no longer holds: the same offer when
        the backend still makes it at a cost within the plan, else a new plan (None: none is left, and
        the job has failed saying why). Each re-quote is a `requoted` event."""
        if not stored.offer.expired(time.time()):
            return stored
        result = await self.plan(self.spec(job), self.policy(job), blocked=self._blocked(job))
        again = requote(stored, result)
        if again is None:
            self.store.move_job(job.id, "failed", reason=f"the planned offer {stored.offer.key} expired and no "
                                                         f"offer is left:\n" + result.explain_failure())
            return None
        outcome = "same offer" if again.offer.key == stored.offer.key else "re-planned"
        self.store.requote_plan(job.id, again.model_dump_json(), detail={
            "offer": stored.offer.key, "expired_at": stored.offer.valid_until, "outcome": outcome,
            "chosen": again.offer.key, "planned_micro_usd": stored.expected_micro_usd,
            "expected_micro_usd": again.expected_micro_usd, "quote": again.offer.quote})
        return again

    def _claimed(self, job: Job, spec: JobSpec, offer: Offer, n: int) -> Offer | None:
        """The offer with what attempt `n` holds of the machine, or None when the job waits queued."""
        backend = self.backend(offer.backend, self.policy(job))
        if not isinstance(backend, AllocatesMachine):
            return offer
        backend.fit(spec, [])  # the inventory is probed (NVML, torch) before, not inside, the write transaction
        claim = self.store.claim(job.id, f"{job.id}.{n}", offer.backend, lambda held: backend.fit(spec, held))
        return None if claim is None else backend.claimed(offer, claim)

    def _release_orphans(self, job: Job, ledger: Ledger, *, keep: str | None) -> None:
        """Release reservations a process made for this job before dying without creating the attempt
        (a crash between `reserve` and `create_attempt`); the one about to be reused is kept."""
        held = {a.reserve_key or _legacy_reserve_key(a) for a in self.store.attempts(job.id)}
        for reservation in ledger.outstanding():
            if reservation.job_id == job.id and reservation.key != keep and reservation.key not in held:
                ledger.release(f"release:{reservation.key}", reservation_key=reservation.key,
                               detail={"outcome": "never dispatched (the dispatching process died)"})

    async def _start(self, job: Job, attempt: Attempt) -> None:
        offer = Offer.model_validate_json(attempt.offer_json)
        backend = self.backend(offer.backend, self.policy(job))
        ctx = await self._context(job, attempt, offer, backend)
        try:
            bundle = await retried(shared_bundles.fetched, job.bundle_sha256, self.progress)
            handle = await retried(backend.submit, bundle, self.spec(job), offer, ctx)
        except (BackendError, bundles.BundleError, OSError) as exc:  # a bundle or folder of ours: our side
            failure = exc if isinstance(exc, BackendError) else LocalEnvironmentError(str(exc))
            await self._react(job, attempt, failure, f"could not start on {offer.backend}: {exc}")
            return
        self.store.set_handle(attempt.id, handle.model_dump_json())
        await self._record_executor(backend, handle, attempt)

    async def _record_executor(self, backend: Backend, handle: Handle, attempt: Attempt) -> None:
        """For an executor we do not control, who it is: its commitment must be signed by this hotkey."""
        if isinstance(backend, RunsUntrusted) and not attempt.executor_hotkey:
            identity = await retried(backend.executor, handle)
            self.store.set_executor(attempt.id, hotkey=identity.hotkey, coldkey=identity.coldkey)

    async def _context(self, job: Job, attempt: Attempt, offer: Offer, backend: Backend) -> AttemptContext:
        workdir = paths.attempt_dir(job.id, attempt.n)
        workdir.mkdir(parents=True, exist_ok=True)
        return AttemptContext(
            job_id=job.id, attempt_id=attempt.id, bundle_sha256=job.bundle_sha256,
            seed=self.spec(job).seed if attempt.seed is None else attempt.seed, workdir=str(workdir),
            # an untrusted executor starts from its own S_0, never from another executor's states
            resume_from=await self._resume_point(job, attempt, backend) if offer.trusted else None,
            challenge_digest=None if offer.trusted else self._challenge_digest(job, attempt),
            max_micro_usd=cost_cap.remaining(self.spec(job), self.store.attempts(job.id), time.time()),
        )

    def _challenge_digest(self, job: Job, attempt: Attempt) -> str:
        """sha256 of the attempt's challenge secret: published at dispatch, the secret revealed after the verdict."""
        from trainmaster.verify.records import SecretStore

        secrets_ = SecretStore(self.store.path)
        try:
            return secrets_.digest(job.id, attempt.id)
        finally:
            secrets_.close()

    async def _resume_point(self, job: Job, attempt: Attempt, backend: Backend) -> str | None:
        """The reference a new attempt resumes from (`_resume_ref`), or None to start afresh."""
        found = await self._resume_ref(job, attempt, backend)
        return found[1].uri if found else None

    async def _resume_ref(self, job: Job, attempt: Attempt, backend: Backend) -> tuple[int, CheckpointRef] | None:
        """(earlier attempt's number, its checkpoint reference): the newest committed state an earlier attempt
        on the same backend reports (`last_checkpoint`: a reference only that backend understands, passed
        back as it is; the broker opens nothing of the backend's). Only states we can trust are resumed
        from: a trusted attempt's that was not rejected, or an accepted one's. A backend that cannot say,
        or cannot be asked now, gives no resume point: the attempt starts afresh."""
        if not isinstance(backend, ResumesFromCheckpoints):
            return None
        for earlier in reversed(self.store.attempts(job.id)):
            if earlier.n >= attempt.n or earlier.backend != attempt.backend or not earlier.handle_json:
                continue
            if not _resumable_from(earlier):
                continue
            try:
                ref = await retried(backend.last_checkpoint, Handle.model_validate_json(earlier.handle_json))
            except BackendError as exc:
                self.store.log_event(job.id, "error", {"message": f"no resume point from attempt {earlier.n}: {exc}"},
                                     attempt.id)
                continue
            if ref is not None:
                return earlier.n, ref
        return None

    async def resume_point(self, job: Job) -> ResumePoint:
        """Where `resume` would start the job from: a step of an earlier attempt's checkpoints (as its backend
        reports them), or scratch."""
        if not job.plan_json:
            return resume_point(None, trusted=True)
        offer = StoredPlan.model_validate_json(job.plan_json).offer
        attempts = self.store.attempts(job.id)
        if not offer.trusted or not attempts:
            return resume_point(None, trusted=offer.trusted)
        upcoming = dataclasses.replace(attempts[-1], n=attempts[-1].n + 1, backend=offer.backend)
        found = await self._resume_ref(job, upcoming, self.backend(offer.backend, self.policy(job)))
        return resume_point(found, trusted=True)

    async def _handle(self, job: Job, attempt: Attempt) -> Handle | None:
        """The attempt's handle; None when it could not be started (what stopped it is recorded)."""
        if attempt.handle_json:
            return Handle.model_validate_json(attempt.handle_json)
        # dispatched, but the process that dispatched died before recording the handle (or the backend
        # could not be reached): submit again, which finds the run it started (idempotent on the attempt id)
        await self._start(job, attempt)
        attempt = self.store.attempt(attempt.id)
        return Handle.model_validate_json(attempt.handle_json) if attempt.handle_json else None

    async def _watch(self, job: Job, attempt: Attempt) -> None:
        if attempt.state in ("returned", "verifying"):
            await self._settle(job, attempt)
            return
        started = attempt.handle_json is None
        handle = await self._handle(job, attempt)
        if started:  # started here: what that recorded
            attempt = self.store.attempt(attempt.id)
        if handle is None or attempt.state in states.ATTEMPT_ENDS:
            return  # it could not be started (again): ended, or waiting, as its failure's reaction says
        backend = self.backend(attempt.backend, self.policy(job))
        if (why := deadlines.overdue(self.spec(job), attempt)) and (ended := await deadlines.judged(backend, handle, why)):
            await self._react(job, attempt, *ended)  # an untrusted run past its time, on the broker's clock
            return
        try:
            st = await retried(backend.status, handle)
        except BackendError as exc:
            await self._react(job, attempt, exc, f"asking {attempt.backend} for the status: {exc}")
            return
        self._reachable(attempt)
        if st.phase is Phase.running:
            if attempt.state == "dispatched":
                self.store.move_attempt(attempt.id, "running", job_target="running", started_at=st.started_at)
            spec = self.spec(job)  # its attempts are read only for a job with a cap
            if spec.limits.max_usd is not None and cost_cap.reached(spec, self.store.attempts(job.id), time.time()):
                await retried(backend.cancel, handle)
                st = await retried(backend.status, handle)
                await self._stopped_at_cap(job, self.store.attempt(attempt.id), st)
        elif st.phase in (Phase.failed, Phase.cancelled) and await self._over_cap(job, attempt):
            await self._stopped_at_cap(job, attempt, st)  # stopped by its backend at the cap, or by us before a crash
        elif st.phase is Phase.succeeded:
            self.store.move_attempt(attempt.id, "returned", job_target="returned",
                                    started_at=st.started_at, ended_at=st.ended_at)
            await self._settle(job, self.store.attempt(attempt.id))
        elif st.phase in (Phase.failed, Phase.cancelled):
            cause = failures.cause_of(st.phase is Phase.cancelled, st.cause, st.exit_code)
            await self._react(job, attempt, cause, st.reason or cause.value, started_at=st.started_at,
                              ended_at=st.ended_at)

    async def _over_cap(self, job: Job, attempt: Attempt) -> bool:
        """Whether the job's spend, this ended attempt's cost recorded, has reached its limits.max_usd."""
        if self.spec(job).limits.max_usd is None:
            return False
        await self._record_cost(job, attempt)
        return cost_cap.reached(self.spec(job), self.store.attempts(job.id), time.time())

    async def _stopped_at_cap(self, job: Job, attempt: Attempt, st) -> None:
        """End the attempt and the job `failed` with the cap as the reason; what it spent is charged."""
        await self._record_cost(job, attempt)
        why = cost_cap.reason(self.spec(job), cost_cap.spent(self.store.attempts(job.id), time.time()))
        await self._end_attempt(job, attempt, "failed", job_target="failed", reason=why,
                                started_at=st.started_at, ended_at=st.ended_at)

    def _retries_left(self, job: Job, attempt: Attempt) -> int:
        """Retries the policy still allows on this attempt's offer after a crash (`retries` per class)."""
        allowed = self.policy(job).for_class(job.workload).retries
        key = Offer.model_validate_json(attempt.offer_json).key
        used = sum(1 for a in self.store.attempts(job.id)
                   if a.n < attempt.n and a.state == "failed" and Offer.model_validate_json(a.offer_json).key == key)
        return allowed - used

    async def _react(self, job: Job, attempt: Attempt, failure: failures.Failure, reason: str, *,
                     started_at: float | None = None, ended_at: float | None = None) -> None:
        """The one reaction (`broker.failures`) to what stopped the attempt: end it, ban its executor,
        and fail the job, fall back, start again on the same offer or cancel; or keep it waiting."""
        reaction = failures.reaction(failure, trusted=Offer.model_validate_json(attempt.offer_json).trusted)
        if reaction is failures.TRANSIENT:
            await self._unreachable(job, attempt, reason)
            return
        if reaction is failures.OUR_ENVIRONMENT:
            message = f"{reason} (on our side: the attempt waits until it is fixed)"
            self.store.log_event(job.id, "error", {"message": message, "cause": reaction.name}, attempt.id)
            raise failures.Waiting(message)
        if reaction.ban:
            ban_rejected(self.executors, hotkey=attempt.executor_hotkey, coldkey=attempt.executor_coldkey,
                         reason=reason, job_id=job.id, attempt_id=attempt.id)
        if reaction.attempt == "rejected":
            await asyncio.to_thread(self._record_fault_verdict, job, attempt, reason)
        after = reaction.job
        if after == "same_offer" and self._retries_left(job, attempt) <= 0:
            after = "fallback"
        job_target = after if after in states.JOB_ENDS else "planned"
        await self._end_attempt(job, attempt, reaction.attempt, job_target=job_target, reason=reason,
                                detail={"cause": reaction.name}, started_at=started_at, ended_at=ended_at)
        if after == "same_offer":  # the stored plan stands: the next attempt resumes from the last committed segment
            offer_key = Offer.model_validate_json(attempt.offer_json).key
            self.store.log_event(job.id, "retry", {"after": reason, "offer": offer_key,
                                                   "retries_left": self._retries_left(job, attempt) - 1}, attempt.id)
        elif after == "fallback":
            await self._replan(self.store.job(job.id), after=reason)

    def _record_fault_verdict(self, job: Job, attempt: Attempt, reason: str) -> None:
        """An attempt rejected for what its executor sent, before any check ran, gets its verdict stored
        like any other (once): `verify show` tells it, and its conclusion may reveal the challenge secret."""
        from trainmaster.verify.records import VerdictStore
        from trainmaster.verify.verdict import Verdict

        verdicts = VerdictStore(self.store.path)
        try:
            if verdicts.latest(job.id, attempt.id) is None:
                verdicts.record(Verdict(outcome="rejected", reasons=[reason], evidence={"executor_fault": reason},
                                        job_id=job.id, attempt_id=attempt.id))
        finally:
            verdicts.close()

    async def _unreachable(self, job: Job, attempt: Attempt, reason: str) -> None:
        """A backend that answers only with transient errors (each call already retried, bounded): the
        attempt keeps its state until it has been unreachable past the class's `unreachable_after_s`
        (first-unreachable time stored), then it is lost: retried on the same offer, then elsewhere."""
        since = self.store.mark_unreachable(attempt.id, reason)
        limit = self.policy(job).for_class(job.workload).unreachable_after_s
        if time.time() - since >= limit:
            await self._react(job, self.store.attempt(attempt.id), Cause.lost,
                              f"lost: unreachable for {time.time() - since:.0f} s, past the policy's "
                              f"unreachable_after_s ({limit:g} s): {reason}")

    def _reachable(self, attempt: Attempt) -> None:
        if attempt.unreachable_since is not None:
            self.store.mark_reachable(attempt.id)

    async def _settle(self, job: Job, attempt: Attempt) -> None:
        """Fetch outputs, record them and the cost, and decide. Each step is idempotent."""
        backend = self.backend(attempt.backend, self.policy(job))
        handle = await self._handle(job, attempt)
        dest = paths.job_dir(job.id) / "outputs"
        hashed_now = False
        if attempt.state == "returned":
            if not self.store.outputs(attempt.id):  # an earlier attempt's folder is never judged as this one's
                await asyncio.to_thread(shutil.rmtree, dest, True)
            trusted = Offer.model_validate_json(attempt.offer_json).trusted
            try:  # a full disk waits on us; an altered transfer is its executor's fault (ours: retried, then failed)
                files = await retried(backend.fetch, handle, dest, self.progress, on=failures.retried_errors(trusted))
            except BackendError as exc:
                await self._react(job, attempt, exc, f"fetching the outputs from {attempt.backend}: {exc}")
                return
            self._reachable(attempt)
            chosen = kept_outputs.select([(f.path, f.size) for f in files], self.spec(job).outputs)
            await asyncio.to_thread(kept_outputs.remove, dest, chosen.dropped)  # excluded: not kept
            if chosen.too_big:
                await self._react(job, attempt, Cause.script_failed, chosen.too_big)
                return
            kept, dropped = _committed(attempt, chosen.kept)
            self.store.record_outputs(attempt.id, [(f.path, f.size, f.sha256) for f in files if f.path in kept])
            await self._record_cost(job, attempt)
            self.store.move_attempt(attempt.id, "verifying", job_target="verifying",
                                    detail={"dropped": list(dropped)} if dropped else None)
            hashed_now = True
        verdict = None if hashed_now else self._final_verdict(job, attempt)  # stored before the process died
        verdict = verdict or await self._verify(job, self.store.attempt(attempt.id), dest, backend, handle, hashed_now)
        # judged with the rest (a pickle among them still rejects the attempt), never kept
        await asyncio.to_thread(kept_outputs.remove, dest, self._dropped(job, attempt))
        if verdict.outcome == "accepted":
            await self._share_outputs(job, attempt, dest)
            opaque = [item["path"] for item in (verdict.evidence.get("safety") or {}).get("opaque", [])]
            await self._end_attempt(job, attempt, "accepted", job_target="accepted",
                                    detail={"verdict": verdict.outcome, **({"opaque": opaque} if opaque else {})})
            await self._promote(job.id)
            await self._give_back_disk(job)
        elif verdict.outcome == "cannot_verify" and (fault := job_fault(verdict.evidence)):
            await self._react(job, attempt, Cause.script_failed, fault)  # the job's own shape: nobody is banned
        elif verdict.outcome == "cannot_verify":
            # the checks could not run (a missing package, a full disk): nothing is paid or blocked; the
            # attempt waits for `trainmaster verify JOB --again`
            why = f"cannot verify: {'; '.join(verdict.reasons)}"
            self.store.move_attempt(attempt.id, "unverified", job_target="unverified", reason=why)
        else:  # rejected: nothing is paid, the offer is blocked, who ran it is banned, the next one tried
            await self._react(job, attempt, failures.REJECTED, f"rejected: {'; '.join(verdict.reasons)}")

    async def _share_outputs(self, job: Job, attempt: Attempt, outputs: Path) -> None:
        """Put the accepted attempt's kept outputs in the shared storage (when set) before the job is accepted, and
        record where (broker/shared_outputs.py): a failure leaves the attempt verifying, its verdict stored, and the
        next pass puts them again."""
        store = shared_storage.store()
        if store is None or any(e.kind == shared_outputs.SHARED_EVENT for e in self.store.events(job.id)):
            return
        detail = await retried(shared_outputs.publish, store, shared_storage.setting(), job.id, attempt.id, outputs,
                               self.store.outputs(attempt.id), self.upload_progress)
        self.store.log_event(job.id, shared_outputs.SHARED_EVENT, detail, attempt.id)

    async def promote_pending(self) -> None:
        """Carry on the promotions left pending (broker/promotion/); what fails stays pending for the next pass."""
        await self._promote()

    async def _promote(self, job_id: str | None = None) -> None:
        """Record the accepted job's lineage and promote it into the model registry (broker/promotion/), or,
        with no job, carry on the promotions left pending. A failure is an `error` event, never the job's: it
        stays accepted and the promotion is retried by the next pass."""
        from trainmaster.broker.promotion import hook

        try:
            if job_id is None:
                await asyncio.to_thread(hook.retry_pending, self.store)
            else:
                await asyncio.to_thread(hook.on_accepted, self.store, job_id)
        except Exception as exc:  # noqa: BLE001 — recorded, retried by the next pass
            if job_id is None:
                logging.getLogger(__name__).warning("retrying pending promotions: %s: %s", type(exc).__name__, exc)
            else:
                self.store.log_event(job_id, "error", {"message": f"promotion: {type(exc).__name__}: {exc}"})

    async def _give_back_disk(self, job: Job) -> None:
        """The retention policy once a job is accepted (broker/reclaim.py): what it frees is a `disk` event; a
        failure (an invalid retention.yaml, a disk error) is an `error` event, never the job's."""
        from trainmaster.broker import reclaim
        from trainmaster.broker.retention import load_retention
        from trainmaster.jobs.yamlfile import FileError

        try:
            retention = load_retention()
            segments = (await reclaim.job_segments(self.store, job.id, self.backend_of)
                        if retention.drop_accepted_segments else [])
            freed = await reclaim.give_back(segments, retention.envs_max_bytes)
        except (FileError, OSError, BackendError) as exc:
            self.store.log_event(job.id, "error", {"message": f"giving disk back: {exc}"})
            return
        if freed:
            sizes = ", ".join(f"{kind} {size / 1e6:.1f} MB" for kind, size in reclaim.by_kind(freed).items() if size)
            self.store.log_event(job.id, "disk", {"reason": f"gave back {sizes} (retention.yaml; `trainmaster gc`)"})

    def _dropped(self, job: Job, attempt: Attempt) -> tuple[str, ...]:
        """The files dropped from the attempt's outputs when it was fetched (recorded on its move to verifying)."""
        return tuple(path for e in self.store.events(job.id) if e.attempt_id == attempt.id and e.to_state == "verifying"
                     for path in (e.detail or {}).get("dropped", []))

    async def _verify(self, job: Job, attempt: Attempt, outputs: Path, backend: Backend, handle: Handle,
                      hashed_now: bool):
        """The verification pipeline (in the audit pool's worker process), with the checks the job's policy sets for this
        kind of compute; for an untrusted executor, its signature and its openings of the challenge.

        The job's code (its evaluator, its own recipe) runs from the bundle the broker sent, extracted
        afresh into the job's `verify/` workspace with its sha256 checked, with the virtualenv the broker
        built for its requirements: never from the attempt's work dir, which the job could rewrite."""
        from trainmaster.verify import pipeline

        offer = Offer.model_validate_json(attempt.offer_json)
        checks = self._checks(job, offer)
        signature, open_segments = None, None
        if not offer.trusted and isinstance(backend, RunsUntrusted) and makes_commitment(self.spec(job)):
            try:
                signature = (await retried(backend.signed_commitment, handle)).signature
            except BackendError as exc:  # the executor sent none: the pipeline rejects an unsigned commitment
                self.store.log_event(job.id, "error", {"message": f"no signed commitment: {exc}"}, attempt.id)
        if "replay" in checks and isinstance(backend, KeepsSegments):
            open_segments = _SegmentOpener(backend, handle, paths.job_dir(job.id) / "openings" / str(attempt.n),
                                           trusted=offer.trusted,
                                           deadline_s=self.policy(job).verification.challenge_deadline_s)
        workspace = paths.job_dir(job.id) / "verify"
        await asyncio.to_thread(shutil.rmtree, workspace, True)  # what a verification that died left (we hold the lock)
        request = pipeline.Attempt(
            job_id=job.id, attempt_id=attempt.id, outputs=outputs, bundle_sha256=job.bundle_sha256,
            spec=self.spec(job), trusted=offer.trusted, recorded_outputs=tuple(self.store.outputs(attempt.id)),
            bundle=await retried(shared_bundles.fetched, job.bundle_sha256, self.progress), workspace=workspace,
            envs_dir=_envs_dir(backend), exact_replay=offer.trusted and backend.exact_replay,
            hotkey=attempt.executor_hotkey, signature=signature,
            outputs_hashed=hashed_now, seed=attempt.seed, previous_metrics=previous_metrics(self.store, job),
            dropped=self._dropped(job, attempt),
        )
        settings = self.policy(job).verification
        return await verifying.verify(
            request, checks=checks, db_path=self.store.path, opener=open_segments,
            audit_settings=pipeline.AuditSettings(calibration_dir=paths.home() / "calibration", tau=settings.tau),
        )

    def _final_verdict(self, job: Job, attempt: Attempt):
        """The attempt's stored verdict when it is final (accepted or rejected): a verdict is reached once."""
        from trainmaster.verify.records import VerdictStore

        verdicts = VerdictStore(self.store.path)
        try:
            verdict = verdicts.latest(job.id, attempt.id)
        finally:
            verdicts.close()
        return verdict if verdict is not None and verdict.outcome in ("accepted", "rejected") else None

    def _checks(self, job: Job, offer: Offer) -> list[str]:
        return checks_for(self.policy(job), self.spec(job), offer)

    async def _end_attempt(self, job: Job, attempt: Attempt, target: str, *, job_target: str | None,
                           reason: str | None = None, detail: dict | None = None,
                           started_at: float | None = None, ended_at: float | None = None) -> None:
        """Record the cost, settle the money, then move: each step idempotent, so a crash between
        them is repaired by running this again and nothing is paid twice."""
        if attempt.handle_json:
            try:
                await self._record_cost(job, attempt)
            except BackendError as exc:  # unreachable, say: it ends all the same, and nothing is charged
                self.store.log_event(job.id, "error", {"message": f"the cost of attempt {attempt.n} could not be "
                                                                  f"had from {attempt.backend}: {exc}"}, attempt.id)
        self._settle_money(job, self.store.attempt(attempt.id), target)
        self.store.move_attempt(attempt.id, target, job_target=job_target, reason=reason, detail=detail,
                                started_at=started_at, ended_at=ended_at)

    def _settle_money(self, job: Job, attempt: Attempt, target: str) -> None:
        """Charge what was actually spent, or release the reservation.

        Compute we pay for by the hour whatever happens (our own power, a cloud's bill) is charged
        at its recorded cost on every end; an untrusted executor is paid only for accepted work, the
        price agreed at dispatch, and its payment is recorded with the charge (sent by the settling
        stage, broker/settlement.py). A TAO cost is charged in rao with the exchange rate it was priced at.
        """
        offer = Offer.model_validate_json(attempt.offer_json)
        ledger = self._ledger(job)
        reservation = attempt.reserve_key or _legacy_reserve_key(attempt)
        if target == "accepted" or (offer.trusted and attempt.cost_micro_usd is not None):
            payee = attempt.executor_coldkey or attempt.executor_hotkey  # TAO goes to the owner's coldkey when known
            payment = (PaymentOrder(attempt_id=attempt.id, payee=payee, rao=attempt.cost_rao or 0)
                       if not offer.trusted and attempt.executor_hotkey else None)
            ledger.charge(f"charge:{attempt.id}", reservation_key=reservation, micro_usd=attempt.cost_micro_usd or 0,
                          rao=attempt.cost_rao or 0, rate_micro_usd_per_tao=attempt.cost_rate_micro_usd_per_tao,
                          detail={"outcome": target, "rate_at": attempt.cost_rate_at,
                                  "rate_stale": attempt.cost_rate_at is None
                                  or time.time() - attempt.cost_rate_at > self.policy(job).tao_rate.max_age_s}
                          if attempt.cost_rao else {"outcome": target}, payment=payment)
        else:
            ledger.release(f"release:{attempt.id}", reservation_key=reservation, detail={"outcome": target})

    def _ledger(self, job: Job) -> Ledger:
        """The ledger on the store's own connection, with the budgets of the job's policy snapshot."""
        policy = self.policy(job)
        key = "|".join(b.model_dump_json() for b in policy.budgets)
        if key not in self._ledgers:
            self._ledgers[key] = Ledger(self.store.db, budgets=policy.budgets)
        return self._ledgers[key]

    async def _record_cost(self, job: Job, attempt: Attempt) -> None:
        """Record what the attempt costs, once: a recorded cost is never asked for again. Trusted compute's
        backend says what it billed; an untrusted executor's cost is the price agreed at dispatch, capped at
        its reservation (`agreed_price`), whatever time it reports."""
        attempt = self.store.attempt(attempt.id)
        if attempt.cost_micro_usd is not None or not attempt.handle_json:
            return
        offer = Offer.model_validate_json(attempt.offer_json)
        if offer.trusted:
            backend = self.backend(attempt.backend, self.policy(job))
            cost = await retried(backend.cost, Handle.model_validate_json(attempt.handle_json), offer)
        else:
            cost = self._agreed_cost(job, attempt, offer)
        if cost.rao:  # the rate a TAO charge is valued at, and whether it was stale when it was used
            rate = Rate(micro_usd_per_tao=cost.rate_micro_usd_per_tao, taken_at=cost.rate_at,
                        source=f"{attempt.backend}'s cost")
            self.store.log_event(job.id, "rate", {"at": "settle", **rate.evidence(self.policy(job).tao_rate.max_age_s)},
                                 attempt.id)
        self.store.record_cost(attempt.id, micro_usd=cost.micro_usd, rao=cost.rao,
                               billable_seconds=cost.billable_seconds, basis=cost.basis,
                               rate_micro_usd_per_tao=cost.rate_micro_usd_per_tao, rate_at=cost.rate_at)

    def _agreed_cost(self, job: Job, attempt: Attempt, offer: Offer) -> Cost:
        """The price agreed when the attempt was dispatched: the offer's price for the hours its reservation
        was made for, never more than that reservation."""
        reservation = self._ledger(job).entry(attempt.reserve_key or _legacy_reserve_key(attempt))
        if reservation is None:
            raise BackendError(f"attempt {attempt.id} has no reservation to take its agreed price from")
        price = agreed(offer, float((reservation.detail or {}).get("hours", 0.0))).capped(reservation.micro_usd)
        return price.cost(rate_at=reservation.at)

    # user actions on a job

    async def verify_again(self, job_id: str) -> Job:
        """Run the checks again on the job's unverified attempt (after the user fixed what stopped them)."""
        job = self.store.find_job(job_id)
        async with self._job_locked(job.id):
            waiting = [a for a in self.store.attempts(job.id) if a.state in states.WAITING]
            if not waiting:
                raise NothingToDo(f"{job.id} has no attempt waiting to be verified again (the job is {job.state})")
            for attempt in waiting:
                self.store.move_attempt(attempt.id, "verifying", job_target="verifying", reason="verified again")
                await self._settle(self.store.job(job.id), self.store.attempt(attempt.id))
        return await self.advance(job.id)

    async def resume(self, job_id: str, *, max_hours: float | None = None, max_usd: str | None = None) -> Job:
        """Start a failed or cancelled job again on its planned offer, from the last committed segment
        an earlier attempt left (a trusted backend's; an untrusted executor always starts afresh), with its
        `max_hours` and `max_usd` raised when given (NothingToDo when a value does not raise them)."""
        job = self.store.find_job(job_id)
        async with self._job_locked(job.id):
            job = self.store.job(job.id)
            if job.state not in ("failed", "cancelled"):
                raise NothingToDo(f"{job.id} is {job.state}; only a failed or cancelled job can be resumed")
            if not job.plan_json:
                raise NothingToDo(f"{job.id} was never planned ({job.reason}); submit it again instead")
            self._raise_limits(job, max_hours, max_usd)
            point = await self.resume_point(job)
            self.store.move_job(job.id, "planned", reason=f"resumed by the user; {point.sentence()}")
        return await self.advance(job.id)

    def _raise_limits(self, job: Job, max_hours: float | None, max_usd: str | None) -> None:
        spec = self.spec(job)
        try:
            fields, shown = raised_limits(spec.limits.model_dump(), max_hours, max_usd)
        except ValueError as exc:
            raise NothingToDo(f"{job.id}: {exc}") from None
        if not fields:
            return
        raised = {**spec.model_dump(mode="json"), "limits": {**spec.limits.model_dump(mode="json"), **fields}}
        self.store.set_spec(job.id, JobSpec.model_validate(raised).model_dump_json(),
                            reason="raised for the resume: " + ", ".join(f"{k} {a} → {b}" for k, (a, b) in shown.items()))

    async def cancel(self, job_id: str) -> Job:
        """Cancel an unfinished job: the request is recorded on the job first, then each unfinished attempt
        ends through its own end (`_cancel_now`), then the job; a process that dies half-way leaves the
        request, which the next `advance` finishes. For any job, whatever its recorded state, the processes
        its ended attempts still run (what a crashed run left) are stopped, each stop a `stopped` event."""
        job = self.store.find_job(job_id)
        async with self._job_locked(job.id):
            job = self.store.job(job.id)
            attempts = self.store.attempts(job.id)
            stopped = {a.id for a in attempts if a.state in states.ACTIVE_ATTEMPT}
            # an ended job with an unfinished attempt is what an older version's cancel left: ended here too
            if job.state not in states.JOB_ENDS or any(a.state not in states.ATTEMPT_ENDS for a in attempts):
                self.store.request_cancel(job.id)
                await self._cancel_now(self.store.job(job.id))
            for attempt in self.store.attempts(job.id):  # what the cancel did not stop at its backend
                if attempt.handle_json and attempt.id not in stopped:
                    backend = self.backend(attempt.backend, self.policy(job))
                    await self._stop_leftovers(job, attempt, backend, Handle.model_validate_json(attempt.handle_json))
        return self.store.job(job.id)

    async def _cancel_now(self, job: Job) -> None:
        """End every unfinished attempt `cancelled` (a running one stopped at its backend first) with its
        money settled, release what a dispatch that died left reserved, then end the job `cancelled`.
        Compute we pay for by the hour is charged what it ran; an untrusted executor's reservation is
        released (it is paid only for accepted work); a queued job just ends."""
        for attempt in self.store.attempts(job.id):
            if attempt.state in states.ATTEMPT_ENDS:
                continue
            if attempt.handle_json and attempt.state in states.ACTIVE_ATTEMPT:
                backend = self.backend(attempt.backend, self.policy(job))
                await retried(backend.cancel, Handle.model_validate_json(attempt.handle_json))
            await self._end_attempt(job, attempt, "cancelled", job_target=None, reason="cancelled by the user",
                                    detail={"cause": failures.CANCELLED.name}, ended_at=time.time())
        self._release_orphans(job, self._ledger(job), keep=None)
        if job.state not in states.JOB_ENDS:
            self.store.move_job(job.id, "cancelled", reason="cancelled by the user")

    async def _stop_leftovers(self, job: Job, attempt: Attempt, backend: Backend, handle: Handle) -> None:
        """An attempt recorded as ended whose processes still run: the backend's cancel stops them and
        says how many (a backend that cannot tell says nothing)."""
        try:
            stopped = await retried(backend.cancel, handle)
        except BackendError as exc:
            self.store.log_event(job.id, "error", {"message": f"stopping what is left of attempt {attempt.n}: {exc}"},
                                 attempt.id)
            return
        if stopped:
            self.store.log_event(job.id, "stopped", {
                "processes": stopped,
                "message": f"attempt {attempt.n} ({attempt.state}) still had {stopped} process(es) running; stopped them",
            }, attempt.id)

    async def logs(self, job_id: str, *, follow: bool = False) -> AsyncIterator[str]:
        """The latest attempt's log from its start; with `follow`, until the job ends (across fallbacks)."""
        job = self.store.find_job(job_id)
        current, offset, watched = None, 0, time.time()
        while True:
            attempts = [a for a in self.store.attempts(job.id) if a.handle_json]
            if not attempts:
                if not follow or self.store.job(job.id).state in states.JOB_ENDS | states.WAITING:
                    return
                await asyncio.sleep(LOG_POLL_S)
                job = await self.advance(job.id)
                continue
            last = attempts[-1]
            if last.id != current:
                current, offset = last.id, 0
            backend = self.backend(last.backend, self.policy(job))
            chunk = await retried(backend.logs, Handle.model_validate_json(last.handle_json), offset)
            offset = chunk.next_offset
            if chunk.text:  # an untrusted executor's log may paint over the terminal: its controls made visible
                yield attempt_log(last.offer_json, chunk.text)
                continue
            if not follow:
                return
            if not chunk.complete and time.time() - watched >= WATCH_S:  # its cost cap is checked as it runs
                job, watched = await self.advance(job.id), time.time()
                continue
            if chunk.complete:
                job = await self.advance(job.id)
                newer = [a for a in self.store.attempts(job.id) if a.handle_json and a.n > last.n]
                if job.state in states.JOB_ENDS | states.WAITING and not newer:
                    return
                if newer:
                    continue
            await asyncio.sleep(LOG_POLL_S)


class NothingToDo(RuntimeError):
    """A user action that does not apply to the job as it is (resume a running job, verify again an accepted one)."""


class _SegmentOpener:
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


def learned(ended: list[tuple[Attempt, str]]) -> tuple[dict[str, float], dict[str, float]]:
    """What past attempts teach the planner: the median runtime of each workload class (in reference
    GPU-hours), each backend's failure rate once it has run enough attempts to say, and each untrusted
    executor's own rate keyed by its offer (reputation: failed or rejected over its attempts plus one, so
    one bad attempt of a newcomer prices half its compute as risk, and a long record counts in full)."""
    runtimes: dict[str, list[float]] = {}
    outcomes: dict[str, list[bool]] = {}
    by_executor: dict[str, list[bool]] = {}
    for attempt, workload in ended:
        offer = Offer.model_validate_json(attempt.offer_json)
        if attempt.state == "accepted" and attempt.billable_seconds:
            runtimes.setdefault(workload, []).append(reference_hours(attempt.billable_seconds / 3600, offer.gpu_type))
        if attempt.state in ("accepted", "failed"):
            key = f"{offer.backend}:{'spot' if offer.spot else 'on-demand'}"
            outcomes.setdefault(key, []).append(attempt.state == "failed")
        if attempt.executor_hotkey and attempt.state in ("accepted", "failed", "rejected"):
            by_executor.setdefault(offer.key, []).append(attempt.state != "accepted")
    history = {w: statistics.median(hours[:HISTORY_RUNS]) for w, hours in runtimes.items()}
    rates = {k: min(sum(fails) / len(fails), MAX_FAILURE_RATE) for k, fails in outcomes.items()
             if len(fails) >= MIN_ATTEMPTS_FOR_RATE}
    rates |= {k: sum(fails) / (len(fails) + 1) for k, fails in by_executor.items() if any(fails)}
    return history, rates


def banned_offers(offer_sets: list[OfferSet], hotkeys: frozenset[str], coldkeys: frozenset[str]) -> set[str]:
    """Keys of the offers made by a banned hotkey or a banned coldkey's hotkeys. An offer's `detail` is
    what the executor quoted: a coldkey that is not a string matches nothing (and breaks nothing)."""
    def owner(offer: Offer) -> str | None:
        coldkey = offer.detail.get("coldkey")
        return coldkey if isinstance(coldkey, str) else None

    return {o.key for s in offer_sets for o in s.offers
            if not o.trusted and (o.instance in hotkeys or owner(o) in coldkeys)}


def _committed(attempt: Attempt, fetched: tuple[str, ...]) -> tuple[set[str], tuple[str, ...]]:
    """The fetched files kept, and those dropped: from untrusted compute only the files bound to the signed
    commitment are kept (verify/committed.py); trusted compute's are all kept."""
    if Offer.model_validate_json(attempt.offer_json).trusted:
        return set(fetched), ()
    from trainmaster.verify.committed import committed_outputs

    chosen = committed_outputs(fetched)
    return set(chosen.kept), chosen.dropped


def _resumable_from(attempt: Attempt) -> bool:
    """Whether a later attempt may start from this attempt's states: an untrusted executor's states
    are trusted only once accepted, and a rejected attempt's never."""
    return attempt.state == "accepted" or (attempt.state != "rejected" and Offer.model_validate_json(attempt.offer_json).trusted)


def attempt_seed(spec_seed: int, nonce: str) -> int:
    """The seed of an untrusted attempt: the spec's seed mixed with a nonce the broker chose (31 bits)."""
    digest = hashlib.sha256(f"trainmaster-attempt-seed-v1:{spec_seed}:{nonce}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFF_FFFF


def _legacy_reserve_key(attempt: Attempt) -> str:
    """The reservation key of attempts recorded before the key was stored with the attempt."""
    return f"reserve:{attempt.id}"


def _envs_dir(backend: Backend) -> Path:
    """Where the backend that ran an attempt built job virtualenvs (the broker's default for the local one)."""
    configured_dir = getattr(backend.config, "envs_dir", None)
    return Path(configured_dir) if configured_dir else paths.envs_dir()


def _max_bundle(spec: JobSpec) -> int:
    return spec.limits.max_bundle_mb * 2**20


@asynccontextmanager
async def _locked(path: Path):
    """An exclusive lock across processes (and coroutines), so two brokers never dispatch or settle
    the same job at once. Polled without blocking, so a daemon's loop keeps running while it waits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(0.02)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
