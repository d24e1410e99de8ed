"""The broker: submit → plan → dispatch → watch → fetch → verify → settle, resumable from any state.

Every step reads the state from SQLite, does its work, and records the new state; `advance`
walks a job as far as it can go right now. Any process (the CLI that submitted, a later
`trainmaster status`, the daemon) can call it after a crash, so no job is lost: a dispatch
that died before recording its handle is found again from the attempt's work dir, and a
settle that died half-way is redone without recording anything twice.
"""

from __future__ import annotations

import asyncio
import fcntl
import secrets
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from trainmaster.backends.base import AttemptContext, Backend, BackendError, Handle, Offer, Phase
from trainmaster.broker import paths, states
from trainmaster.broker.planner import Plan, PlanError, gather_offers, plan, reference_hours
from trainmaster.broker.policy import Policy, load_policy
from trainmaster.broker.store import Attempt, Job, Store
from trainmaster.jobs import bundle as bundles
from trainmaster.jobs.spec import JobSpec, LoadedSpec, load_spec
from trainmaster.wallet.ledger import BudgetExceeded, Ledger

PLAN_ROWS_KEPT = 20  # of the considered offers, kept in the plan's event row
HISTORY_RUNS = 20  # newest accepted runs of a class that estimate its runtime
MIN_ATTEMPTS_FOR_RATE = 5  # ended attempts of a backend before its failure rate prices risk


@dataclass(frozen=True)
class Prepared:
    """A spec checked, bundled in memory and planned: what `submit --dry-run` shows."""

    loaded: LoadedSpec
    policy: Policy
    plan: Plan
    bundle: bundles.BundleInfo


class Broker:
    def __init__(self, store: Store | None = None, backends: dict[str, Backend] | None = None):
        self.store = store or Store(paths.state_db())
        self._backends = backends or {}
        self._ledgers: dict[str, Ledger] = {}

    def close(self) -> None:
        for ledger in self._ledgers.values():
            ledger.close()
        self.store.close()

    # backends

    def backend(self, name: str, policy: Policy | None = None) -> Backend:
        if name not in self._backends:
            from trainmaster.backends.registry import backend_class

            cls = backend_class(name)
            if name == "local":
                self._backends[name] = cls(power=(policy or load_policy()).power, envs_dir=paths.home() / "envs")
            else:
                self._backends[name] = cls()
        return self._backends[name]

    def _enabled(self, spec: JobSpec, policy: Policy) -> dict[str, Backend]:
        from trainmaster.backends.registry import BACKENDS

        cls = policy.for_class(spec.workload)
        names = [n for n in (cls.constraints.allowed_backends or cls.chain) if n in BACKENDS]
        return {n: self.backend(n, policy) for n in names}

    def plan(self, spec: JobSpec, policy: Policy, blocked: frozenset[str] = frozenset()) -> Plan:
        offer_sets = asyncio.run(gather_offers(spec, self._enabled(spec, policy)))
        history, failure_rates = learned(self.store.ended_attempts())
        return plan(spec, policy, offer_sets, blocked=blocked, history=history, failure_rates=failure_rates)

    # submit

    def _planned(self, spec_path: Path, policy_name: str) -> tuple[LoadedSpec, Policy, Plan]:
        """The spec checked and planned under the policy (raises FileError, PlanError)."""
        loaded = load_spec(spec_path)
        policy = load_policy(policy_name)
        result = self.plan(loaded.spec, policy)
        if result.chosen is None:
            raise PlanError(result)
        return loaded, policy, result

    def prepare(self, spec_path: Path, policy_name: str = "default") -> Prepared:
        """Check, plan and hash without writing anything (raises FileError, PlanError, BundleError)."""
        loaded, policy, result = self._planned(spec_path, policy_name)
        info = bundles.bundle_digest(loaded.code_dir, loaded.spec.canonical_json(), max_bytes=_max_bundle(loaded.spec))
        return Prepared(loaded=loaded, policy=policy, plan=result, bundle=info)

    def submit(self, spec_path: Path, policy_name: str = "default") -> Job:
        """Plan, bundle, record and dispatch. Nothing is recorded unless the spec, plan and bundle are good."""
        loaded, _, result = self._planned(spec_path, policy_name)
        info = bundles.build_bundle(loaded.code_dir, loaded.spec.canonical_json(), paths.bundles_dir(),
                                    max_bytes=_max_bundle(loaded.spec))
        job_id = f"{loaded.spec.name}-{secrets.token_hex(4)}"
        self.store.create_job(
            job_id=job_id, name=loaded.spec.name, workload=loaded.spec.workload, project=loaded.spec.project,
            spec_json=loaded.spec.model_dump_json(), spec_path=str(loaded.path), bundle_sha256=info.sha256,
            policy=policy_name, detail={"bundle_bytes": info.size, "files": info.files},
        )
        self._record_plan(job_id, result)
        self.advance(job_id)
        return self.store.job(job_id)

    def _record_plan(self, job_id: str, result: Plan) -> None:
        chosen = result.chosen
        self.store.move_job(job_id, "planned", detail={
            "chosen": chosen.offer.key, "expected_micro_usd": chosen.expected_micro_usd,
            "considered": [[r.offer.key, r.verdict] for r in result.rows[:PLAN_ROWS_KEPT]],
            "offers": len(result.rows),
        })

    # the state machine, driven from whatever state is recorded

    def advance(self, job_id: str) -> Job:
        """Move a job as far as it can go now; safe to call from any process at any time."""
        job = self.store.job(job_id)
        if job.state in states.JOB_ENDS:
            return job
        with _locked(paths.job_dir(job_id) / ".lock"):
            job = self.store.job(job_id)
            if job.state == "submitted":
                self._replan(job, blocked=frozenset())
            job = self.store.job(job_id)
            if job.state == "planned":
                self._dispatch(job)
            for attempt in self.store.attempts(job_id):
                if attempt.state not in states.ATTEMPT_ENDS:
                    self._watch(job, attempt)
        return self.store.job(job_id)

    def refresh(self) -> None:
        """Advance every job that is not finished (what each CLI command does first)."""
        for job in self.store.jobs(states_in=set(states.JOB_TRANSITIONS) - states.JOB_ENDS, limit=1000):
            try:
                self.advance(job.id)
            except BackendError as exc:
                self.store.log_event(job.id, "error", {"message": str(exc)})

    def wait(self, job_id: str, *, poll_s: float = 0.2, timeout_s: float | None = None) -> Job:
        deadline = time.time() + timeout_s if timeout_s else None
        while True:
            job = self.advance(job_id)
            if job.state in states.JOB_ENDS:
                return job
            if deadline and time.time() > deadline:
                return job
            time.sleep(poll_s)

    def _spec(self, job: Job) -> JobSpec:
        return JobSpec.model_validate_json(job.spec_json)

    def _replan(self, job: Job, blocked: frozenset[str]) -> None:
        result = self.plan(self._spec(job), load_policy(job.policy), blocked=blocked)
        if result.chosen is None:
            self.store.move_job(job.id, "failed", reason=result.explain_failure())
        else:
            self._record_plan(job.id, result)

    def _blocked(self, job: Job) -> frozenset[str]:
        return frozenset(Offer.model_validate_json(a.offer_json).key for a in self.store.attempts(job.id)
                         if a.state in ("failed", "rejected"))

    def _dispatch(self, job: Job) -> None:
        result = self.plan(self._spec(job), load_policy(job.policy), blocked=self._blocked(job))
        if result.chosen is None:
            self.store.move_job(job.id, "failed", reason=result.explain_failure())
            return
        offer = result.chosen.offer
        n = len(self.store.attempts(job.id)) + 1
        try:
            self._ledger(job).reserve(
                _reserve_key(f"{job.id}.{n}"), job_id=job.id, backend=offer.backend, workload=job.workload,
                project=job.project, micro_usd=result.chosen.expected_micro_usd,
                detail={"offer": offer.key, "hours": result.chosen.hours},
            )
        except BudgetExceeded as exc:
            self.store.move_job(job.id, "failed", reason=f"refused by budget: {exc}")
            return
        attempt = self.store.create_attempt(job.id, backend=offer.backend, offer_json=offer.model_dump_json())
        self._start(job, attempt)

    def _start(self, job: Job, attempt: Attempt) -> None:
        offer = Offer.model_validate_json(attempt.offer_json)
        backend = self.backend(offer.backend)
        ctx = self._context(job, attempt)
        try:
            handle = backend.submit(paths.bundles_dir() / f"{job.bundle_sha256}.tar", self._spec(job), offer, ctx)
        except (BackendError, bundles.BundleError, OSError) as exc:
            self._attempt_failed(job, attempt, f"could not start on {offer.backend}: {exc}", retry=True)
            return
        self.store.set_handle(attempt.id, handle.model_dump_json())

    def _context(self, job: Job, attempt: Attempt) -> AttemptContext:
        workdir = paths.attempt_dir(job.id, attempt.n)
        workdir.mkdir(parents=True, exist_ok=True)
        return AttemptContext(job_id=job.id, attempt_id=attempt.id, bundle_sha256=job.bundle_sha256,
                              seed=self._spec(job).seed, workdir=str(workdir), resume_from=self._resume_point(job, attempt))

    def _resume_point(self, job: Job, attempt: Attempt) -> str | None:
        """A new attempt continues from the latest checkpoint an earlier one left, where there is one
        (the runtime picks that directory's newest complete segment)."""
        for earlier in reversed(self.store.attempts(job.id)):
            checkpoints = paths.attempt_dir(job.id, earlier.n) / "checkpoints"
            if earlier.n < attempt.n and earlier.state != "rejected" and checkpoints.is_dir() and any(checkpoints.iterdir()):
                return str(checkpoints)
        return None

    def handle(self, job: Job, attempt: Attempt) -> Handle:
        if attempt.handle_json:
            return Handle.model_validate_json(attempt.handle_json)
        # dispatched, but the process that dispatched died before recording the handle
        self._start(job, attempt)
        attempt = self.store.attempt(attempt.id)
        if not attempt.handle_json:
            raise BackendError(f"attempt {attempt.id} could not be started again")
        return Handle.model_validate_json(attempt.handle_json)

    def _watch(self, job: Job, attempt: Attempt) -> None:
        if attempt.state in ("returned", "verifying"):
            self._settle(job, attempt)
            return
        backend = self.backend(attempt.backend)
        st = backend.status(self.handle(job, attempt))
        if st.phase is Phase.running and attempt.state == "dispatched":
            self.store.move_attempt(attempt.id, "running", job_target="running", started_at=st.started_at)
        elif st.phase is Phase.succeeded:
            self.store.move_attempt(attempt.id, "returned", job_target="returned",
                                    started_at=st.started_at, ended_at=st.ended_at)
            self._settle(job, self.store.attempt(attempt.id))
        elif st.phase is Phase.cancelled:
            self._end_attempt(job, attempt, "cancelled", job_target="cancelled", reason=st.reason or "cancelled",
                              started_at=st.started_at, ended_at=st.ended_at)
        elif st.phase is Phase.failed:
            # a script that exits non-zero failed on its own; a process that vanished may succeed elsewhere
            self._attempt_failed(job, attempt, st.reason or "failed", retry=st.exit_code is None,
                                 started_at=st.started_at, ended_at=st.ended_at)

    def _attempt_failed(self, job: Job, attempt: Attempt, reason: str, *, retry: bool, state: str = "failed",
                        started_at: float | None = None, ended_at: float | None = None) -> None:
        times = {"started_at": started_at, "ended_at": ended_at}
        self._end_attempt(job, attempt, state, job_target="planned" if retry else "failed", reason=reason, **times)
        if not retry:
            return
        job = self.store.job(job.id)
        result = self.plan(self._spec(job), load_policy(job.policy), blocked=self._blocked(job))
        if result.chosen is None:
            self.store.move_job(job.id, "failed", reason=f"{reason}; {result.explain_failure()}")
        else:
            self.store.log_event(job.id, "replanned", {"chosen": result.chosen.offer.key, "after": reason})

    def _settle(self, job: Job, attempt: Attempt) -> None:
        """Fetch outputs, record them and the cost, and decide. Each step is idempotent."""
        backend = self.backend(attempt.backend)
        handle = self.handle(job, attempt)
        dest = paths.job_dir(job.id) / "outputs"
        if attempt.state == "returned":
            files = backend.fetch(handle, dest)  # BackendError (e.g. disk full) leaves the attempt `returned`
            self.store.record_outputs(attempt.id, [(f.path, f.size, f.sha256) for f in files])
            self._record_cost(attempt)
            self.store.move_attempt(attempt.id, "verifying", job_target="verifying")
        verdict = self._verify(job, attempt, dest)
        if verdict.outcome == "accepted":
            self._end_attempt(job, attempt, "accepted", job_target="accepted", detail={"verdict": verdict.outcome})
        else:
            # rejected (or impossible to verify): nothing is paid, the offer is blocked, the next one tried
            why = f"{verdict.outcome.replace('_', ' ')}: {'; '.join(verdict.reasons)}"
            self._attempt_failed(job, attempt, why, retry=True, state="rejected")

    def _verify(self, job: Job, attempt: Attempt, outputs: Path):
        """The verification pipeline, with the checks the job's policy sets for this kind of compute."""
        from trainmaster.verify import pipeline

        offer = Offer.model_validate_json(attempt.offer_json)
        settings = load_policy(job.policy).verification
        return pipeline.verify_attempt(
            pipeline.Attempt(
                job_id=job.id, attempt_id=attempt.id, outputs=outputs, bundle_sha256=job.bundle_sha256,
                spec=self._spec(job), trusted=offer.trusted, recorded_outputs=tuple(self.store.outputs(attempt.id)),
                code_dir=paths.attempt_dir(job.id, attempt.n) / "code",
                exact_replay=offer.backend == "local",
            ),
            checks=settings.trusted if offer.trusted else settings.untrusted,
            db_path=paths.state_db(),
            audit_settings=pipeline.AuditSettings(calibration_dir=paths.home() / "calibration", tau=settings.tau),
        )

    def _end_attempt(self, job: Job, attempt: Attempt, target: str, *, job_target: str | None,
                     reason: str | None = None, detail: dict | None = None,
                     started_at: float | None = None, ended_at: float | None = None) -> None:
        """Record the cost, settle the money, then move: each step idempotent, so a crash between
        them is repaired by running this again and nothing is paid twice."""
        if attempt.handle_json:
            self._record_cost(attempt)
        self._settle_money(job, self.store.attempt(attempt.id), target)
        self.store.move_attempt(attempt.id, target, job_target=job_target, reason=reason, detail=detail,
                                started_at=started_at, ended_at=ended_at)

    def _settle_money(self, job: Job, attempt: Attempt, target: str) -> None:
        """Charge what was actually spent, or release the reservation.

        Compute we pay for by the hour whatever happens (our own power, a cloud's bill) is charged
        at its recorded cost on every end; an untrusted executor is paid only for accepted work.
        """
        offer = Offer.model_validate_json(attempt.offer_json)
        ledger = self._ledger(job)
        reservation = _reserve_key(attempt.id)
        if target == "accepted" or (offer.trusted and attempt.cost_micro_usd is not None):
            ledger.charge(f"charge:{attempt.id}", reservation_key=reservation, micro_usd=attempt.cost_micro_usd or 0,
                          rao=attempt.cost_rao or 0, detail={"outcome": target})
        else:
            ledger.release(f"release:{attempt.id}", reservation_key=reservation, detail={"outcome": target})

    def _ledger(self, job: Job) -> Ledger:
        policy = load_policy(job.policy)
        if policy.name not in self._ledgers:
            self._ledgers[policy.name] = Ledger(self.store.path, budgets=policy.budgets)
        return self._ledgers[policy.name]

    def _record_cost(self, attempt: Attempt) -> None:
        offer = Offer.model_validate_json(attempt.offer_json)
        cost = self.backend(attempt.backend).cost(Handle.model_validate_json(attempt.handle_json), offer)
        self.store.record_cost(attempt.id, micro_usd=cost.micro_usd, rao=cost.rao,
                               billable_seconds=cost.billable_seconds, basis=cost.basis)

    # user actions on a job

    def cancel(self, job_id: str) -> Job:
        job = self.store.find_job(job_id)
        if job.state in states.JOB_ENDS:
            return job
        for attempt in self.store.attempts(job.id):
            if attempt.state in states.ACTIVE_ATTEMPT and attempt.handle_json:
                self.backend(attempt.backend).cancel(Handle.model_validate_json(attempt.handle_json))
                self._end_attempt(job, attempt, "cancelled", job_target=None, reason="cancelled by the user")
        self.store.move_job(job.id, "cancelled", reason="cancelled by the user")
        return self.store.job(job.id)

    def logs(self, job_id: str, *, follow: bool = False) -> Iterator[str]:
        job = self.store.find_job(job_id)
        attempts = [a for a in self.store.attempts(job.id) if a.handle_json]
        if not attempts:
            return iter(())
        last = attempts[-1]
        return self.backend(last.backend).logs(Handle.model_validate_json(last.handle_json), follow=follow)


def learned(ended: list[tuple[Attempt, str]]) -> tuple[dict[str, float], dict[str, float]]:
    """What past attempts teach the planner: the median runtime of each workload class (in reference
    GPU-hours) and each backend's failure rate, once it has run enough attempts to say."""
    runtimes: dict[str, list[float]] = {}
    outcomes: dict[str, list[bool]] = {}
    for attempt, workload in ended:
        offer = Offer.model_validate_json(attempt.offer_json)
        if attempt.state == "accepted" and attempt.billable_seconds:
            runtimes.setdefault(workload, []).append(reference_hours(attempt.billable_seconds / 3600, offer.gpu_type))
        if attempt.state in ("accepted", "failed"):
            key = f"{offer.backend}:{'spot' if offer.spot else 'on-demand'}"
            outcomes.setdefault(key, []).append(attempt.state == "failed")
    history = {w: statistics.median(hours[:HISTORY_RUNS]) for w, hours in runtimes.items()}
    rates = {k: sum(fails) / len(fails) for k, fails in outcomes.items() if len(fails) >= MIN_ATTEMPTS_FOR_RATE}
    return history, rates


def _reserve_key(attempt_id: str) -> str:
    return f"reserve:{attempt_id}"


def _max_bundle(spec: JobSpec) -> int:
    return spec.limits.max_bundle_mb * 2**20


@contextmanager
def _locked(path: Path):
    """An exclusive lock across processes, so two CLIs never dispatch or settle the same job at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
