"""What every stage of a job's life works with.

`Parts` is the broker's, kept for its life: the state store, the backends as configured (broker/backend_set.py),
the policies parsed, one ledger per set of budgets, the executors' records, the settling stage, and the jobs'
locks. `JobContext` is one job as a step read it: its row, and its spec, policy, ledger and stored plan parsed
once from that row. A step that moves the job reads it again (`reread`) before it looks at it again.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

from trainmaster.backends.base import Backend, Offer, Progress
from trainmaster.broker import paths
from trainmaster.broker.backend_set import BackendSet
from trainmaster.broker.planning.stored_plan import StoredPlan
from trainmaster.broker.planning.policy import Policy, load_policy
from trainmaster.broker.stages.job_lock import JobLocks
from trainmaster.broker.store import Attempt, Job, Store
from trainmaster.jobs.spec import JobSpec
from trainmaster.wallet.ledger import Ledger

if TYPE_CHECKING:
    from trainmaster.broker.executors import Executors
    from trainmaster.broker.money.settlement import Settlement
    from trainmaster.wallet.payments import PaymentSender


class NothingToDo(RuntimeError):
    """A user action that does not apply to the job as it is (resume a running job, verify again an accepted one)."""


class Parts:
    """The broker's parts every stage uses; `progress` is drawn while outputs and bundles are fetched."""

    def __init__(self, store: Store, backends: BackendSet, *, progress: Progress | None = None,
                 sender: PaymentSender | None = None):
        self.store = store
        self.backends = backends
        self.progress = progress
        self._locks: JobLocks | None = None
        self._sender = sender
        """The payment sender given (tests); None: the one backends.yaml names (`broker.payment_sender`)."""
        self._settlement: Settlement | None = None
        self._executors: Executors | None = None
        self._policies: dict[str, Policy] = {}
        self._ledgers: dict[str, Ledger] = {}
        self.offer_rounds = 0
        """How many times offers were gathered from the backends (one per plan)."""

    @property
    def locks(self) -> JobLocks:
        """The jobs' locks (broker/stages/job_lock.py)."""
        if self._locks is None:
            self._locks = JobLocks(self.store.path)
        return self._locks

    @property
    def upload_progress(self) -> Progress | None:
        return self.backends.upload_progress

    def close(self) -> None:
        for ledger in self._ledgers.values():
            ledger.close()
        if self._locks is not None:
            self._locks.close()
        self.store.close()

    def job(self, job_id: str) -> JobContext:
        """The job as it is recorded now."""
        return JobContext(self, self.store.job(job_id))

    def of(self, job: Job) -> JobContext:
        """The job as the caller just read it."""
        return JobContext(self, job)

    def policy(self, job: Job) -> Policy:
        """The policy the job was submitted under (its stored snapshot), parsed once per process per distinct
        snapshot: keyed by the snapshot, so a daemon's cache grows with the policies, not with the jobs."""
        key = job.policy_json or f"name:{job.policy}"
        if key not in self._policies:
            self._policies[key] = (Policy.model_validate_json(job.policy_json) if job.policy_json
                                   else load_policy(job.policy))  # a job stored before snapshots existed
        return self._policies[key]

    def remember_policy(self, policy: Policy) -> None:
        """A policy just snapshotted with a job: its parsed form is this one."""
        self._policies[policy.model_dump_json()] = policy

    def ledger(self, policy: Policy) -> Ledger:
        """The ledger on the store's own connection, with the budgets of `policy`."""
        key = "|".join(b.model_dump_json() for b in policy.budgets)
        if key not in self._ledgers:
            self._ledgers[key] = Ledger(self.store.db, budgets=policy.budgets)
        return self._ledgers[key]

    def backend_of(self, job: Job, attempt: Attempt) -> Backend | None:
        """The backend an attempt ran on, as its job's policy configures it; None when this version has no
        backend by that name (an attempt of a backend since removed, or one only a test provided)."""
        from trainmaster.backends.registry import UnknownBackend

        try:
            return self.backends.backend(attempt.backend, self.policy(job))
        except UnknownBackend:
            return None

    @property
    def settlement(self) -> Settlement:
        """The settling stage after a verdict: payments sent and conclusions delivered, exactly once."""
        if self._settlement is None:
            from trainmaster.broker.money.payment_sender import configured_sender
            from trainmaster.broker.money.settlement import Settlement

            sender = self._sender or configured_sender(self.backends.configs(), self.store.db)
            self._settlement = Settlement(self.store.db, self.store.path, key_path=paths.home() / "keys" / "broker.key",
                                          sender=sender)
        return self._settlement

    @property
    def executors(self) -> Executors:
        """Bans and reputation of the executors we do not control, across jobs."""
        if self._executors is None:
            from trainmaster.broker.executors import Executors

            self._executors = Executors(self.store.db)
        return self._executors


class JobContext:
    """One job as a step read it, with the broker's parts."""

    def __init__(self, parts: Parts, job: Job):
        self.parts = parts
        self.job = job

    @property
    def store(self) -> Store:
        return self.parts.store

    @property
    def id(self) -> str:
        return self.job.id

    @cached_property
    def spec(self) -> JobSpec:
        return JobSpec.model_validate_json(self.job.spec_json)

    @cached_property
    def policy(self) -> Policy:
        return self.parts.policy(self.job)

    @cached_property
    def ledger(self) -> Ledger:
        return self.parts.ledger(self.policy)

    @cached_property
    def plan(self) -> StoredPlan | None:
        """The stored plan (None before the job was planned)."""
        return StoredPlan.model_validate_json(self.job.plan_json) if self.job.plan_json else None

    def backend(self, name: str) -> Backend:
        """The backend `name` as the job's policy configures it."""
        return self.parts.backends.backend(name, self.policy)

    def attempts(self) -> list[Attempt]:
        return self.store.attempts(self.job.id)

    def reread(self) -> JobContext:
        """The job as it is recorded now."""
        return self.parts.job(self.job.id)

    def log(self, kind: str, detail: dict, attempt_id: str | None = None) -> None:
        """An event on the job (an `error` says what went wrong; the job's state is not moved)."""
        self.store.log_event(self.job.id, kind, detail, attempt_id)

    def blocked(self) -> frozenset[str]:
        """The offers an attempt of this job failed or was rejected on, and every offer of a backend whose set-up
        refused an attempt of it (broker/readiness.py): never planned on again for it."""
        from trainmaster.broker import readiness

        attempts = self.attempts()
        return frozenset(Offer.model_validate_json(a.offer_json).key for a in attempts
                         if a.state in ("failed", "rejected")) | readiness.blocked_backends(attempts,
                                                                                           self.store.events(self.job.id))
