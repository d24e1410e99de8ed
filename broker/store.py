"""State in the state database (a SQLite file in WAL mode, or PostgreSQL): jobs, attempts, outputs and the event log of every run.

Every state change is one transaction that checks the move against `broker.states`, updates the
row only if it is still in the state the caller saw (so two processes racing to settle the same
job cannot both win), and appends an event row. Re-applying a change that already happened is a
no-op, which is what lets any process resume any job after a crash.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmaster.broker import states
from trainmaster.storage import statedb

MIGRATIONS: list[list[str]] = [
    [  # 1: the foundation
        """CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        workload TEXT NOT NULL,
        project TEXT,
        state TEXT NOT NULL,
        spec_json TEXT NOT NULL,
        spec_path TEXT NOT NULL,
        bundle_sha256 TEXT NOT NULL,
        policy TEXT NOT NULL,
        reason TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    )""",
        """CREATE INDEX jobs_state ON jobs(state)""",
        """CREATE TABLE attempts (
        id TEXT PRIMARY KEY,
        job_id TEXT NOT NULL REFERENCES jobs(id),
        n INTEGER NOT NULL,
        backend TEXT NOT NULL,
        offer_json TEXT NOT NULL,
        handle_json TEXT,
        state TEXT NOT NULL,
        reason TEXT,
        started_at REAL,
        ended_at REAL,
        cost_micro_usd INTEGER,
        cost_rao INTEGER,
        billable_seconds REAL,
        created_at REAL NOT NULL,
        UNIQUE (job_id, n)
    )""",
        """CREATE INDEX attempts_state ON attempts(state)""",
        """CREATE TABLE outputs (
        attempt_id TEXT NOT NULL REFERENCES attempts(id),
        path TEXT NOT NULL,
        size INTEGER NOT NULL,
        sha256 TEXT NOT NULL,
        PRIMARY KEY (attempt_id, path)
    )""",
        """CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id TEXT NOT NULL,
        attempt_id TEXT,
        at REAL NOT NULL,
        kind TEXT NOT NULL,
        from_state TEXT,
        to_state TEXT,
        detail TEXT
    )""",
        """CREATE INDEX events_job ON events(job_id, id)""",
    ],
    [  # 2: plan once (the job keeps its plan and the policy it was planned under); the untrusted path
        "ALTER TABLE jobs ADD COLUMN policy_json TEXT",
        "ALTER TABLE jobs ADD COLUMN plan_json TEXT",
        "ALTER TABLE attempts ADD COLUMN executor_hotkey TEXT",
        "ALTER TABLE attempts ADD COLUMN executor_coldkey TEXT",
        "ALTER TABLE attempts ADD COLUMN reserve_key TEXT",
        "ALTER TABLE attempts ADD COLUMN cost_rate_micro_usd_per_tao INTEGER",
        "ALTER TABLE attempts ADD COLUMN cost_rate_at REAL",
    ],
    [  # 3: each attempt's seed (an untrusted one's is derived from a nonce the broker chose)
        "ALTER TABLE attempts ADD COLUMN seed INTEGER",
    ],
    [  # 4: the machine as a resource: what each local attempt holds, and the queue of jobs waiting for it
        "ALTER TABLE jobs ADD COLUMN queued_at REAL",
        """CREATE TABLE claims (
        attempt_id TEXT PRIMARY KEY,
        job_id TEXT NOT NULL REFERENCES jobs(id),
        backend TEXT NOT NULL,
        resources TEXT NOT NULL,
        at REAL NOT NULL
    )""",
    ],
    [  # 5: failures and cancels: when an attempt was first found unreachable, and a cancel requested on a job
        "ALTER TABLE attempts ADD COLUMN unreachable_since REAL",
        "ALTER TABLE jobs ADD COLUMN cancel_requested_at REAL",
    ],
    [  # 6: the refereed tier: the two attempts of a pair name the first one's id (broker/stages/refereeing.py)
        "ALTER TABLE attempts ADD COLUMN referee_pair TEXT",
    ],
]


SHOWN = 5
"""At most this many ids of the jobs a reference matches are listed; one more is asked for, to know whether there
are others."""


def several_jobs(ref: str, ids: list[str]) -> str:
    """How a job reference that matches several jobs is told: the ids found (fetched up to SHOWN + 1), with `…` only
    when there are more."""
    listed = ", ".join(ids[:SHOWN]) + (", …" if len(ids) > SHOWN else "")
    return f"{ref!r} matches several jobs: {listed}; give more of the id"


@dataclass(frozen=True)
class Job:
    id: str
    name: str
    workload: str
    project: str | None
    state: str
    spec_json: str
    spec_path: str
    bundle_sha256: str
    policy: str
    reason: str | None
    created_at: float
    updated_at: float
    policy_json: str | None = None
    """The policy as it was at submit: the job is planned, dispatched and settled under it."""
    plan_json: str | None = None
    """The current plan (`broker.planning.stored_plan.StoredPlan`): made at submit, remade only after a failed attempt."""
    queued_at: float | None = None
    """When the job last started waiting `queued` (its place in the queue)."""
    cancel_requested_at: float | None = None
    """When the user asked to cancel the unfinished job (each attempt is ended first, then the job)."""


@dataclass(frozen=True)
class Attempt:
    id: str
    job_id: str
    n: int
    backend: str
    offer_json: str
    handle_json: str | None
    state: str
    reason: str | None
    started_at: float | None
    ended_at: float | None
    cost_micro_usd: int | None
    cost_rao: int | None
    billable_seconds: float | None
    created_at: float
    executor_hotkey: str | None = None
    executor_coldkey: str | None = None
    reserve_key: str | None = None
    cost_rate_micro_usd_per_tao: int | None = None
    cost_rate_at: float | None = None
    seed: int | None = None
    """The seed the attempt runs with (the spec's, or for an untrusted executor one derived from a nonce)."""
    unreachable_since: float | None = None
    """When its backend first answered only with transient errors (cleared once it answers again)."""
    referee_pair: str | None = None
    """The refereed tier: the id of the first attempt of the pair this one belongs to (itself for the first);
    None for an attempt run alone."""


@dataclass(frozen=True)
class Event:
    id: int
    job_id: str
    attempt_id: str | None
    at: float
    kind: str
    from_state: str | None
    to_state: str | None
    detail: dict[str, Any] | None


class NotFound(KeyError):
    pass


class InvariantBroken(RuntimeError):
    """A move would leave the store inconsistent: an ended job with an unfinished attempt, or an ended
    attempt whose reservation is still held (a bug: the transaction is rolled back)."""


class StateUnavailable(RuntimeError):
    """The state database cannot be opened (a bad TRAINMASTER_HOME, a corrupt or foreign file)."""


class Store:
    def __init__(self, path: Path | str):
        self.path = path
        """Where the state lives: a SQLite file's path, or a `postgresql://` URL (storage/statedb.py)."""
        self.transactions = 0
        """Write transactions opened through `tx` (every change of a job goes through one): a caller that sees
        none opened since it read a row knows this store left the row as it was."""
        try:
            self.db = statedb.connect(path)
            with self.tx() as db:
                statedb.migrate(db, version_table="schema_version", migrations=MIGRATIONS, what=statedb.shown(path))
        except (statedb.Error, OSError, statedb.SchemaTooNew) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            if isinstance(path, Path) and path.parent.exists() and not path.parent.is_dir():
                why = f"{path.parent} is a file, not a folder"
            remedy = ("check TRAINMASTER_DATABASE_URL and that the server is up" if statedb.is_server(path) else
                      "set TRAINMASTER_HOME to a writable folder, or move the file aside to start afresh")
            raise StateUnavailable(f"cannot open the state database {statedb.shown(path)}: {why} ({remedy})") from None

    def close(self) -> None:
        self.db.close()

    def tx(self) -> AbstractContextManager[Any]:
        """One write transaction, taken up front (statedb.immediate) so check-then-write is atomic."""
        self.transactions += 1
        return statedb.immediate(self.db)

    @property
    def schema_version(self) -> int:
        return self.db.execute("SELECT version FROM schema_version").fetchone()[0]

    # jobs

    def create_job(
        self, *, job_id: str, name: str, workload: str, project: str | None, spec_json: str, spec_path: str,
        bundle_sha256: str, policy: str, policy_json: str, detail: dict | None = None,
    ) -> Job:
        now = time.time()
        with self.tx() as db:
            db.execute(
                "INSERT INTO jobs (id, name, workload, project, state, spec_json, spec_path, bundle_sha256, policy,"
                " reason, created_at, updated_at, policy_json) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (job_id, name, workload, project, "submitted", spec_json, spec_path, bundle_sha256, policy, None, now,
                 now, policy_json),
            )
            self._event(db, job_id, None, "transition", None, "submitted", detail)
        return self.job(job_id)

    def job(self, job_id: str) -> Job:
        row = self.db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise NotFound(f"no job {job_id!r}")
        return Job(**row)

    def find_job(self, prefix: str) -> Job:
        """A job by id or unique id prefix, matched case by case (`Run-1` is not `run-1`); an empty or
        blank reference names no job, however few there are."""
        if not prefix.strip():
            raise NotFound("empty job reference: give a job id or a unique prefix of one")
        rows = self.db.execute(
            "SELECT * FROM jobs WHERE id = ? OR substr(id, 1, ?) = ? ORDER BY id LIMIT ?",
            (prefix, len(prefix), prefix, SHOWN + 1),
        ).fetchall()
        exact = [r for r in rows if r["id"] == prefix]
        if exact or len(rows) == 1:
            return Job(**(exact or rows)[0])
        if not rows:
            raise NotFound(f"no job {prefix!r}")
        raise NotFound(several_jobs(prefix, [r["id"] for r in rows]))

    def jobs(self, *, states_in: set[str] | None = None, limit: int = 100) -> list[Job]:
        sql, args = "SELECT * FROM jobs", []
        if states_in:
            sql += f" WHERE state IN ({','.join('?' * len(states_in))})"
            args += sorted(states_in)
        sql += " ORDER BY created_at DESC, id DESC"
        if limit >= 0:  # a negative limit: every job
            sql, args = sql + " LIMIT ?", [*args, limit]
        rows = self.db.execute(sql, args).fetchall()
        return [Job(**r) for r in rows]

    def move_job(self, job_id: str, target: str, *, reason: str | None = None, detail: dict | None = None) -> bool:
        """Move a job to `target`; False when it is already there. Illegal moves raise."""
        with self.tx() as db:
            return self._move_job(db, job_id, target, reason=reason, detail=detail)

    def _move_job(self, db, job_id, target, *, reason=None, detail=None, attempt_id=None) -> bool:
        row = db.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise NotFound(f"no job {job_id!r}")
        current = row["state"]
        if current == target:
            return False
        states.check("job", current, target)
        db.execute(
            "UPDATE jobs SET state = ?, reason = COALESCE(?, reason), updated_at = ? WHERE id = ? AND state = ?",
            (target, reason, time.time(), job_id, current),
        )
        if current in states.JOB_ENDS:  # resumed: an old cancel request is done with
            db.execute("UPDATE jobs SET cancel_requested_at = NULL WHERE id = ?", (job_id,))
        self._event(db, job_id, attempt_id, "transition", current, target, _with_reason(detail, reason))
        if target in states.JOB_ENDS:
            _refuse_violations(db, job_id)
        return True

    def request_cancel(self, job_id: str) -> bool:
        """Record that the user wants the unfinished job cancelled (once, with an event); False when it
        was already requested. `Broker.advance` ends each attempt and then the job."""
        with self.tx() as db:
            row = db.execute("SELECT cancel_requested_at FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise NotFound(f"no job {job_id!r}")
            if row["cancel_requested_at"] is not None:
                return False
            db.execute("UPDATE jobs SET cancel_requested_at = ? WHERE id = ?", (time.time(), job_id))
            self._event(db, job_id, None, "cancel_requested", None, None, None)
            return True

    def violations(self, job_id: str) -> list[str]:
        """What breaks the store's invariants for this job (empty when none): an ended job has only
        ended attempts, and every ended attempt's reservation is settled (charged or released)."""
        return _violations(self.db, job_id)

    def set_plan(self, job_id: str, plan_json: str, *, detail: dict) -> None:
        """Record the job's plan (and a `planned` event); the job moves to `planned` unless it is there."""
        with self.tx() as db:
            db.execute("UPDATE jobs SET plan_json = ?, updated_at = ? WHERE id = ?", (plan_json, time.time(), job_id))
            if not self._move_job(db, job_id, "planned", detail=detail):
                self._event(db, job_id, None, "replanned", None, None, detail)

    def requote_plan(self, job_id: str, plan_json: str, *, detail: dict) -> None:
        """Replace the job's plan with one whose offer was quoted again before dispatch (a `requoted`
        event); the job stays where it is (planned or queued)."""
        with self.tx() as db:
            db.execute("UPDATE jobs SET plan_json = ?, updated_at = ? WHERE id = ?", (plan_json, time.time(), job_id))
            self._event(db, job_id, None, "requoted", None, None, detail)

    # the machine's queue (see `claim`)

    def claim(self, job_id: str, attempt_id: str, backend: str,
              fit: Callable[[list[dict]], tuple[dict | None, str]]) -> dict | None:
        """Claim what `fit` grants the attempt beside the claims held on `backend`, or queue the job.

        One transaction reads the held claims, asks `fit` and writes the claim, so concurrent
        dispatches (any process) never both get the same resources. The queue is first come, first
        served: while jobs wait ahead of this one, it waits too. A claim already made for the attempt
        (by a process that died before dispatching it) is returned as it is.
        """
        with self.tx() as db:
            row = db.execute("SELECT resources FROM claims WHERE attempt_id = ?", (attempt_id,)).fetchone()
            if row is not None:
                return json.loads(row["resources"])
            ahead = self._ahead(db, job_id)
            claim, why = (None, f"{ahead} job(s) queued before it") if ahead else fit(self._held(db, backend))
            if claim is None:
                self._enqueue(db, job_id, why, ahead)
                return None
            db.execute("INSERT INTO claims (attempt_id, job_id, backend, resources, at) VALUES (?,?,?,?,?)",
                       (attempt_id, job_id, backend, json.dumps(claim, sort_keys=True), time.time()))
            self._event(db, job_id, attempt_id, "claimed", None, None, {"backend": backend, **claim})
            return claim

    def start_preview(self, backend: str, fit: Callable[[list[dict]], tuple[dict | None, str]]) -> str:
        """Whether a new job would start now or wait (what `submit --dry-run` says); writes nothing."""
        ahead = self._ahead(self.db, None)
        if ahead:
            return f"would wait in the queue, behind {ahead} job(s)"
        claim, why = fit(self._held(self.db, backend))
        return "would start now" if claim is not None else f"would wait in the queue: {why}"

    def queue_position(self, job_id: str) -> int | None:
        """1 for the next job to start; None when the job is not queued for the machine (a job waiting for its
        budget, broker/money/budget_wait.py, has no place in that queue)."""
        row = self.db.execute("SELECT state, queued_at FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None or row["state"] != "queued" or row["queued_at"] is None:
            return None
        return self._ahead(self.db, job_id) + 1

    def queued_jobs(self) -> list[Job]:
        """The queue, first to start first."""
        rows = self.db.execute("SELECT * FROM jobs WHERE state = 'queued'"
                               " ORDER BY queued_at IS NULL, queued_at, created_at, id").fetchall()
        return [Job(**r) for r in rows]

    def holders(self) -> list[str]:
        """Jobs whose attempts hold a claim now: advancing them frees what their ended runs held."""
        return sorted({r["job_id"] for r in self._held_rows(self.db, None)})

    @staticmethod
    def _held_rows(db, backend: str | None) -> list:
        """Claims still held: the attempt is dispatched or running, or (no attempt yet) its job is being
        dispatched; a claim whose attempt ended, or whose job ended before dispatch, holds nothing."""
        active = sorted(states.ACTIVE_ATTEMPT)
        sql = (
            "SELECT c.* FROM claims c JOIN jobs j ON j.id = c.job_id LEFT JOIN attempts a ON a.id = c.attempt_id"
            f" WHERE ((a.id IS NOT NULL AND a.state IN ({','.join('?' * len(active))}))"
            " OR (a.id IS NULL AND j.state IN ('planned', 'queued')))"
        )
        args: list = [*active]
        if backend is not None:
            sql += " AND c.backend = ?"
            args.append(backend)
        return db.execute(sql, args).fetchall()

    def _held(self, db, backend: str) -> list[dict]:
        return [json.loads(r["resources"]) for r in self._held_rows(db, backend)]

    @staticmethod
    def _ahead(db, job_id: str | None) -> int:
        """Queued jobs that start before `job_id` (all of them when it is not queued)."""
        row = db.execute("SELECT state, queued_at FROM jobs WHERE id = ?", (job_id,)).fetchone() if job_id else None
        if row is None or row["state"] != "queued" or row["queued_at"] is None:  # a budget's waiters hold no place
            return db.execute("SELECT COUNT(*) FROM jobs WHERE state = 'queued' AND queued_at IS NOT NULL AND id != ?",
                              (job_id or "",)).fetchone()[0]
        return db.execute(
            "SELECT COUNT(*) FROM jobs WHERE state = 'queued' AND (queued_at < ? OR (queued_at = ? AND id < ?))",
            (row["queued_at"], row["queued_at"], job_id),
        ).fetchone()[0]

    def _enqueue(self, db, job_id: str, why: str, ahead: int) -> None:
        """The job waits `queued` (its place taken now); one event, not one per look at the queue."""
        row = db.execute("SELECT state, queued_at FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row["state"] == "queued" and row["queued_at"] is not None:
            return
        db.execute("UPDATE jobs SET queued_at = ? WHERE id = ?", (time.time(), job_id))
        if row["state"] == "queued":  # it waited for its budget; now for the machine
            self._event(db, job_id, None, "waiting", None, None, {"waiting": why, "position": ahead + 1})
            return
        self._move_job(db, job_id, "queued", detail={"waiting": why, "position": ahead + 1})

    def wait_for_budget(self, job_id: str, why: str, *, attempt_id: str | None = None) -> None:
        """The job waits `queued` for a budget whose room other jobs' reservations hold (broker/money/budget_wait.py),
        with `why` as its reason: the claim made for `attempt_id` is given back, and the job holds no place in the
        machine's queue (`queued_at` is NULL) while it waits. One event, when it starts waiting."""
        with self.tx() as db:
            if attempt_id is not None:
                db.execute("DELETE FROM claims WHERE attempt_id = ?", (attempt_id,))
            row = db.execute("SELECT state, queued_at, reason FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise NotFound(f"no job {job_id!r}")
            db.execute("UPDATE jobs SET queued_at = NULL, reason = ?, updated_at = ? WHERE id = ?",
                       (why, time.time(), job_id))
            if row["state"] != "queued":
                self._move_job(db, job_id, "queued", detail={"waiting": why})
            elif row["queued_at"] is not None or not (row["reason"] or "").startswith(why.split(":")[0]):
                self._event(db, job_id, None, "waiting", None, None, {"waiting": why})

    def budget_wait_over(self, job_id: str, prefix: str) -> None:
        """The job's reservation was made: the reason it waited with (starting `prefix`) no longer holds."""
        with self.tx() as db:
            db.execute("UPDATE jobs SET reason = NULL WHERE id = ? AND reason LIKE ?", (job_id, prefix + "%"))


    def set_spec(self, job_id: str, spec_json: str, *, reason: str) -> None:
        """Replace the job's spec (a resume raising its limits), with a `limits` event saying what changed."""
        with self.tx() as db:
            db.execute("UPDATE jobs SET spec_json = ?, updated_at = ? WHERE id = ?", (spec_json, time.time(), job_id))
            self._event(db, job_id, None, "limits", None, None, {"reason": reason})

    # attempts

    def create_attempt(self, job_id: str, *, backend: str, offer_json: str, reserve_key: str, seed: int,
                       detail: dict | None = None, pair: str | None = None) -> Attempt:
        """A new attempt on an offer; the job moves to `dispatched` in the same transaction. `pair`: the first
        attempt of the refereed pair this one joins (`self`: it starts one)."""
        with self.tx() as db:
            n = db.execute("SELECT COALESCE(MAX(n), 0) + 1 FROM attempts WHERE job_id = ?", (job_id,)).fetchone()[0]
            attempt_id = f"{job_id}.{n}"
            referee_pair = attempt_id if pair == "self" else pair
            db.execute(
                "INSERT INTO attempts (id, job_id, n, backend, offer_json, state, created_at, reserve_key, seed,"
                " referee_pair) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (attempt_id, job_id, n, backend, offer_json, "dispatched", time.time(), reserve_key, seed, referee_pair),
            )
            if referee_pair in (None, attempt_id):
                self._move_job(db, job_id, "dispatched", attempt_id=attempt_id,
                               detail={"backend": backend, **(detail or {})})
            else:  # a refereed pair's second attempt: the job moves with the first
                self._event(db, job_id, attempt_id, "partner", None, "dispatched",
                            {"backend": backend, "pair": referee_pair, **(detail or {})})
        return self.attempt(attempt_id)

    def attempt(self, attempt_id: str) -> Attempt:
        row = self.db.execute("SELECT * FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
        if row is None:
            raise NotFound(f"no attempt {attempt_id!r}")
        return Attempt(**row)

    def attempts(self, job_id: str) -> list[Attempt]:
        rows = self.db.execute("SELECT * FROM attempts WHERE job_id = ? ORDER BY n", (job_id,)).fetchall()
        return [Attempt(**r) for r in rows]

    def active_attempts(self) -> list[Attempt]:
        rows = self.db.execute(
            f"SELECT * FROM attempts WHERE state IN ({','.join('?' * len(states.ACTIVE_ATTEMPT | {'returned', 'verifying'}))})"
            " ORDER BY created_at",
            sorted(states.ACTIVE_ATTEMPT | {"returned", "verifying"}),
        ).fetchall()
        return [Attempt(**r) for r in rows]

    def ended_attempts(self, limit: int = 1000) -> list[tuple[Attempt, str]]:
        """The newest ended attempts with their job's workload class: what the planner learns from."""
        rows = self.db.execute(
            f"SELECT a.*, j.workload AS workload FROM attempts a JOIN jobs j ON j.id = a.job_id"
            f" WHERE a.state IN ({','.join('?' * len(states.ATTEMPT_ENDS))}) ORDER BY a.created_at DESC LIMIT ?",
            [*sorted(states.ATTEMPT_ENDS), limit],
        ).fetchall()
        return [(Attempt(**{k: r[k] for k in r.keys() if k != "workload"}), r["workload"]) for r in rows]

    def accepted_runs(self, name: str, limit: int) -> list[tuple[Attempt, str]]:
        """The newest accepted attempts of jobs named `name`, each with its job's spec (JSON)."""
        rows = self.db.execute(
            "SELECT a.*, j.spec_json AS job_spec FROM attempts a JOIN jobs j ON j.id = a.job_id"
            " WHERE j.name = ? AND a.state = 'accepted' AND a.billable_seconds > 0 ORDER BY a.created_at DESC LIMIT ?",
            (name, limit),
        ).fetchall()
        return [(Attempt(**{k: r[k] for k in r.keys() if k != "job_spec"}), r["job_spec"]) for r in rows]

    def awaiting_conclusion(self) -> bool:
        """Whether an untrusted attempt with a final verdict has no acknowledged conclusion yet
        (broker/money/conclusions.py): a command must then run its refresh,
        which settles it, even when every job has ended."""
        from trainmaster.broker.money import conclusions

        judged = [attempt_id for _, attempt_id in judged_untrusted(self.db)]
        return len(conclusions.acknowledged(self.db, judged)) < len(judged)

    def next_attempt_number(self, job_id: str) -> int:
        return self.db.execute("SELECT COALESCE(MAX(n), 0) + 1 FROM attempts WHERE job_id = ?", (job_id,)).fetchone()[0]

    def set_handle(self, attempt_id: str, handle_json: str) -> None:
        with self.tx() as db:
            db.execute("UPDATE attempts SET handle_json = ? WHERE id = ?", (handle_json, attempt_id))

    def set_executor(self, attempt_id: str, *, hotkey: str, coldkey: str | None) -> None:
        """Who runs an untrusted attempt, recorded once at dispatch: its commitment must be signed by this key."""
        with self.tx() as db:
            row = db.execute("SELECT job_id, executor_hotkey FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
            if row["executor_hotkey"] is not None:
                return
            db.execute("UPDATE attempts SET executor_hotkey = ?, executor_coldkey = ? WHERE id = ?",
                       (hotkey, coldkey, attempt_id))
            self._event(db, row["job_id"], attempt_id, "executor", None, None, {"hotkey": hotkey, "coldkey": coldkey})

    def move_attempt(
        self, attempt_id: str, target: str, *, job_target: str | None = None, reason: str | None = None,
        detail: dict | None = None, started_at: float | None = None, ended_at: float | None = None,
    ) -> bool:
        """Move an attempt (and, when given, its job) in one transaction; False if already there."""
        with self.tx() as db:
            row = db.execute("SELECT job_id, state, reserve_key FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
            if row is None:
                raise NotFound(f"no attempt {attempt_id!r}")
            current, job_id = row["state"], row["job_id"]
            if current == target:
                return False
            states.check("attempt", current, target)
            db.execute(
                "UPDATE attempts SET state = ?, reason = COALESCE(?, reason), started_at = COALESCE(?, started_at),"
                " ended_at = COALESCE(?, ended_at) WHERE id = ? AND state = ?",
                (target, reason, started_at, ended_at, attempt_id, current),
            )
            self._event(db, job_id, attempt_id, "attempt", current, target, _with_reason(detail, reason))
            key = row["reserve_key"] or f"reserve:{attempt_id}"
            if target in states.ATTEMPT_ENDS and _unsettled(db, [key]):
                raise InvariantBroken(f"attempt {attempt_id} cannot end {target}: its reservation {key} is still held")
            if job_target is not None:
                self._move_job(db, job_id, job_target, reason=reason, attempt_id=attempt_id)
            return True

    def mark_unreachable(self, attempt_id: str, reason: str) -> float:
        """Since when the attempt's backend has answered only with transient errors: recorded the first
        time (with an event), kept until it answers again."""
        with self.tx() as db:
            row = db.execute("SELECT job_id, unreachable_since FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
            if row["unreachable_since"] is not None:
                return row["unreachable_since"]
            now = time.time()
            db.execute("UPDATE attempts SET unreachable_since = ? WHERE id = ?", (now, attempt_id))
            self._event(db, row["job_id"], attempt_id, "unreachable", None, None, {"message": reason})
            return now

    def mark_reachable(self, attempt_id: str) -> None:
        """The attempt's backend answered again: its unreachable time starts afresh next time."""
        with self.tx() as db:
            db.execute("UPDATE attempts SET unreachable_since = NULL WHERE id = ? AND unreachable_since IS NOT NULL",
                       (attempt_id,))

    def record_cost(self, attempt_id: str, *, micro_usd: int, rao: int, billable_seconds: float, basis: str,
                    rate_micro_usd_per_tao: int | None = None, rate_at: float | None = None) -> None:
        with self.tx() as db:
            row = db.execute("SELECT job_id, cost_micro_usd FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
            if row["cost_micro_usd"] is not None:
                return  # recorded once; a resumed settle does not record again
            db.execute(
                "UPDATE attempts SET cost_micro_usd = ?, cost_rao = ?, billable_seconds = ?,"
                " cost_rate_micro_usd_per_tao = ?, cost_rate_at = ? WHERE id = ?",
                (micro_usd, rao, billable_seconds, rate_micro_usd_per_tao, rate_at, attempt_id),
            )
            detail = {"micro_usd": micro_usd, "rao": rao, "billable_seconds": billable_seconds, "basis": basis}
            if rao:
                detail.update(rate_micro_usd_per_tao=rate_micro_usd_per_tao, rate_at=rate_at)
            self._event(db, row["job_id"], attempt_id, "cost", None, None, detail)

    def record_outputs(self, attempt_id: str, files: list[tuple[str, int, str]]) -> None:
        with self.tx() as db:
            db.executemany(
                "INSERT INTO outputs (attempt_id, path, size, sha256) VALUES (?,?,?,?) ON CONFLICT (attempt_id, path)"
                " DO UPDATE SET size = excluded.size, sha256 = excluded.sha256",
                [(attempt_id, p, s, h) for p, s, h in files],
            )

    def outputs(self, attempt_id: str) -> list[tuple[str, int, str]]:
        rows = self.db.execute(
            "SELECT path, size, sha256 FROM outputs WHERE attempt_id = ? ORDER BY path", (attempt_id,)
        ).fetchall()
        return [tuple(r) for r in rows]

    # events

    def log_event(self, job_id: str, kind: str, detail: dict, attempt_id: str | None = None) -> None:
        with self.tx() as db:
            self._event(db, job_id, attempt_id, kind, None, None, detail)

    def events(self, job_id: str) -> list[Event]:
        rows = self.db.execute("SELECT * FROM events WHERE job_id = ? ORDER BY id", (job_id,)).fetchall()
        return [Event(**{**dict(r), "detail": json.loads(r["detail"]) if r["detail"] else None}) for r in rows]

    @staticmethod
    def _event(db, job_id, attempt_id, kind, from_state, to_state, detail) -> None:
        db.execute(
            "INSERT INTO events (job_id, attempt_id, at, kind, from_state, to_state, detail) VALUES (?,?,?,?,?,?,?)",
            (job_id, attempt_id, time.time(), kind, from_state, to_state,
             json.dumps(detail, sort_keys=True) if detail else None),
        )


def _violations(db, job_id: str) -> list[str]:
    job = db.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
    attempts = db.execute("SELECT id, n, state, reserve_key FROM attempts WHERE job_id = ? ORDER BY n",
                          (job_id,)).fetchall()
    found = []
    if job is not None and job["state"] in states.JOB_ENDS:
        found += [f"job {job_id} is {job['state']} but its attempt {a['n']} is {a['state']}"
                  for a in attempts if a["state"] not in states.ATTEMPT_ENDS]
    ended = {a["reserve_key"] or f"reserve:{a['id']}": a for a in attempts if a["state"] in states.ATTEMPT_ENDS}
    found += [f"attempt {ended[key]['n']} of {job_id} is {ended[key]['state']} but its reservation {key} is still held"
              for key in sorted(_unsettled(db, list(ended)))]
    return found


def _unsettled(db, keys: list[str]) -> set[str]:
    """Those of the reservations `keys` neither charged nor released (the ledger shares the state database)."""
    from trainmaster.wallet.ledger import unsettled

    return unsettled(db, keys)


def _refuse_violations(db, job_id: str) -> None:
    if found := _violations(db, job_id):
        raise InvariantBroken("; ".join(found))


def _with_reason(detail: dict | None, reason: str | None) -> dict | None:
    if reason is None:
        return detail
    return {**(detail or {}), "reason": reason}


# What others read of the store's tables (the daemon's views and notifications, the executors' records, settlement,
# triggers), each on a connection the caller holds: the one place outside `Store` these tables are named in SQL
# (tests/repo/test_sql_owners.py).

def job_counts(db) -> dict[str, int]:
    """Jobs per state that holds any."""
    return {r[0]: r[1] for r in db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state")}


def queue_latencies(db) -> list[float]:
    """Seconds from each job's submission to its first dispatch (jobs never dispatched are left out)."""
    rows = db.execute(
        "SELECT MIN(e.at) - j.created_at FROM jobs j JOIN events e ON e.job_id = j.id"
        " WHERE e.kind = 'transition' AND e.to_state = 'dispatched' GROUP BY j.id"
    )
    return [max(0.0, r[0]) for r in rows]


def newest_jobs(db, limit: int, offset: int = 0) -> list:
    """Rows (id, name, state, reason, created_at, updated_at, backend, cost) of the newest jobs from the `offset`-th
    on: the backend of the latest attempt that started, and what they cost (an untrusted executor's work that was
    not accepted costs nothing)."""
    return db.execute(
        "SELECT j.id, j.name, j.state, j.reason, j.created_at, j.updated_at,"
        " (SELECT a.backend FROM attempts a WHERE a.job_id = j.id AND a.handle_json IS NOT NULL"
        " ORDER BY a.n DESC LIMIT 1) AS backend,"
        " (SELECT COALESCE(SUM(CASE WHEN a.executor_hotkey IS NOT NULL AND a.state <> 'accepted' THEN 0"
        " ELSE a.cost_micro_usd END), 0) FROM attempts a WHERE a.job_id = j.id) AS cost"  # unpaid work costs nothing
        " FROM jobs j ORDER BY j.created_at DESC, j.id DESC LIMIT ? OFFSET ?",
        (limit, offset),
    ).fetchall()


def job_total(db) -> int:
    return db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]


def failed_since(db, since: float) -> int:
    """Jobs that ended failed at or after `since`."""
    return db.execute("SELECT COUNT(*) FROM jobs WHERE state = 'failed' AND updated_at >= ?", (since,)).fetchone()[0]


def job_exists(db, job_id: str) -> bool:
    return db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is not None


def job_ends_after(db, after: int) -> list:
    """Rows (id, job_id, at, to_state, detail) of the transitions into an end after the event `after`, in order."""
    ends = sorted(states.JOB_ENDS)
    return db.execute(
        f"SELECT e.id, e.job_id, e.at, e.to_state, e.detail FROM events e WHERE e.id > ? AND e.kind = 'transition'"
        f" AND e.to_state IN ({','.join('?' * len(ends))}) ORDER BY e.id", (after, *ends)).fetchall()


def newest_event_id(db) -> int | None:
    return db.execute("SELECT MAX(id) FROM events").fetchone()[0]


def budget_scope(db, job_id: str) -> tuple[Any, set[str]] | None:
    """(the job's row: workload, project, policy, policy_json; the backends its attempts ran on), or None."""
    job = db.execute("SELECT workload, project, policy, policy_json FROM jobs WHERE id = ?", (job_id,)).fetchone()
    if job is None:
        return None
    return job, {b for (b,) in db.execute("SELECT backend FROM attempts WHERE job_id = ?", (job_id,))}


def job_submitted_with(db, origin_field: str, key: str) -> str | None:
    """The job whose submission recorded `key` in its origin's `origin_field`, if any."""
    field = statedb.dialect(db).json_text("detail", "origin", origin_field)
    row = db.execute(
        "SELECT job_id FROM events WHERE kind = 'transition' AND to_state = 'submitted'"
        f" AND {field} = ? LIMIT 1", (key,)).fetchone()
    return row[0] if row else None


def executor_records(db) -> list:
    """Rows (hotkey, coldkey, accepted, rejected, failed, last_at) of every hotkey that ran an attempt, with how its
    ended attempts ended, the most recent first."""
    ends = sorted(states.ATTEMPT_ENDS)
    return db.execute(
        "SELECT executor_hotkey AS hotkey, MAX(executor_coldkey) AS coldkey,"
        " SUM(CASE WHEN state = 'accepted' THEN 1 ELSE 0 END) AS accepted,"
        " SUM(CASE WHEN state = 'rejected' THEN 1 ELSE 0 END) AS rejected,"
        " SUM(CASE WHEN state = 'failed' THEN 1 ELSE 0 END) AS failed, MAX(created_at) AS last_at FROM attempts"
        f" WHERE executor_hotkey IS NOT NULL AND state IN ({','.join('?' * len(ends))})"
        " GROUP BY executor_hotkey ORDER BY last_at DESC", ends,
    ).fetchall()


def judged_untrusted(db, job_id: str | None = None) -> list[tuple[str, str]]:
    """(job id, attempt id) of each attempt of an untrusted executor with a final verdict (accepted or rejected),
    oldest first (of `job_id` when given)."""
    sql = ("SELECT a.job_id, a.id FROM attempts a WHERE a.state IN ('accepted', 'rejected')"
           " AND a.executor_hotkey IS NOT NULL")
    args: tuple = ()
    if job_id is not None:
        sql, args = sql + " AND a.job_id = ?", (job_id,)
    return [(row[0], row[1]) for row in db.execute(sql + " ORDER BY a.created_at", args).fetchall()]
