"""Read-only views of the state database for `/metrics` and the dashboard.

Each caller opens the file read-only (`reading`), runs a few SELECTs and closes it; callers run
these off the event loop (`asyncio.to_thread`). A part whose tables are not made yet (the ledger
before the first reservation, the verdicts before the first verdict) reads as empty.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from trainmaster.broker import states
from trainmaster.storage import statedb
from trainmaster.wallet.budget import Budget
from trainmaster.wallet.ledger import Usage, _usage  # the ledger's own count on a connection (no public name yet)


class StateMissing(RuntimeError):
    """The state database does not exist (yet) or cannot be read."""


@dataclass(frozen=True)
class JobRow:
    id: str
    name: str
    state: str
    reason: str | None
    backend: str | None
    """The backend of its latest attempt (None before the first dispatch)."""
    cost_micro_usd: int
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class BackendSpend:
    backend: str
    micro_usd: int
    rao: int


@dataclass(frozen=True)
class VerdictRow:
    job_id: str
    attempt_id: str | None
    outcome: str
    reasons: list[str]
    checks: list[str]
    evidence: dict
    created_at: float


@contextmanager
def reading(path: Path) -> Iterator[sqlite3.Connection]:
    """The state database opened read-only (never created: a missing file raises StateMissing); on a
    database server (a `postgresql://` URL), a connection of its own."""
    if statedb.is_server(path):
        yield from _server(path)
        return
    if not Path(path).is_file():
        raise StateMissing(f"no state database at {path}")
    try:
        db = sqlite3.connect(f"{Path(path).absolute().as_uri()}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error as exc:
        raise StateMissing(f"cannot read the state database {path}: {exc}") from None
    db.row_factory = sqlite3.Row
    try:
        yield db
    finally:
        db.close()


def _server(url: str) -> Iterator:
    try:
        db = statedb.connect(url)
    except statedb.Error as exc:
        raise StateMissing(f"cannot read the state database: {exc}") from None
    try:
        yield db
    finally:
        db.close()


def has_table(db: sqlite3.Connection, name: str) -> bool:
    return statedb.table_exists(db, name)


def job_counts(db: sqlite3.Connection) -> dict[str, int]:
    """Jobs per state, every state named (0 when none is in it)."""
    counts = dict.fromkeys(states.JOB_TRANSITIONS, 0)
    if has_table(db, "jobs"):
        counts.update({r[0]: r[1] for r in db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state")})
    return counts


def charged_by_backend(db: sqlite3.Connection) -> list[BackendSpend]:
    """What was charged on each backend, ever (the ledger's `charge` rows)."""
    return _by_backend(db, "SELECT backend, SUM(micro_usd), SUM(rao) FROM ledger_entries WHERE kind = 'charge'"
                           " GROUP BY backend ORDER BY backend")


def reserved_by_backend(db: sqlite3.Connection) -> list[BackendSpend]:
    """What is held now on each backend: reservations not yet charged or released."""
    return _by_backend(db, "SELECT backend, SUM(micro_usd), SUM(rao) FROM ledger_entries r WHERE kind = 'reserve'"
                           " AND NOT EXISTS (SELECT 1 FROM ledger_entries s WHERE s.reservation_key = r.key)"
                           " GROUP BY backend ORDER BY backend")


def _by_backend(db: sqlite3.Connection, sql: str) -> list[BackendSpend]:
    if not has_table(db, "ledger_entries"):
        return []
    return [BackendSpend(r[0], r[1], r[2]) for r in db.execute(sql)]


def verdict_counts(db: sqlite3.Connection) -> dict[str, int]:
    """Verdicts recorded per outcome (every outcome named; a re-verification counts again)."""
    counts = {"accepted": 0, "rejected": 0, "cannot_verify": 0}
    if has_table(db, "verdicts"):
        counts.update({r[0]: r[1] for r in db.execute("SELECT outcome, COUNT(*) FROM verdicts GROUP BY outcome")})
    return counts


def queue_latencies(db: sqlite3.Connection) -> list[float]:
    """Seconds from each job's submission to its first dispatch (jobs never dispatched are left out)."""
    if not has_table(db, "jobs"):
        return []
    rows = db.execute(
        "SELECT MIN(e.at) - j.created_at FROM jobs j JOIN events e ON e.job_id = j.id"
        " WHERE e.kind = 'transition' AND e.to_state = 'dispatched' GROUP BY j.id"
    )
    return [max(0.0, r[0]) for r in rows]


def jobs(db: sqlite3.Connection, limit: int, offset: int = 0) -> list[JobRow]:
    """The newest jobs (from the `offset`-th on) with the backend of their latest attempt that started (a job that
    never ran shows none) and what they cost (an untrusted executor's work that was not accepted costs nothing)."""
    if not has_table(db, "jobs"):
        return []
    rows = db.execute(
        "SELECT j.id, j.name, j.state, j.reason, j.created_at, j.updated_at,"
        " (SELECT a.backend FROM attempts a WHERE a.job_id = j.id AND a.handle_json IS NOT NULL"
        " ORDER BY a.n DESC LIMIT 1) AS backend,"
        " (SELECT COALESCE(SUM(CASE WHEN a.executor_hotkey IS NOT NULL AND a.state <> 'accepted' THEN 0"
        " ELSE a.cost_micro_usd END), 0) FROM attempts a WHERE a.job_id = j.id) AS cost"  # unpaid work costs nothing
        " FROM jobs j ORDER BY j.created_at DESC, j.id DESC LIMIT ? OFFSET ?",
        (limit, offset),
    )
    return [JobRow(id=r["id"], name=r["name"], state=r["state"], reason=r["reason"], backend=r["backend"],
                   cost_micro_usd=r["cost"], created_at=r["created_at"], updated_at=r["updated_at"]) for r in rows]


def job_total(db: sqlite3.Connection) -> int:
    return db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] if has_table(db, "jobs") else 0


def failed_since(db: sqlite3.Connection, since: float) -> int:
    """Jobs that ended failed at or after `since`."""
    if not has_table(db, "jobs"):
        return 0
    return db.execute("SELECT COUNT(*) FROM jobs WHERE state = 'failed' AND updated_at >= ?", (since,)).fetchone()[0]


def unsent_payments(db: sqlite3.Connection) -> int:
    """Payments charged but not sent yet (pending: broker/payment_states.py)."""
    if not has_table(db, "payments"):
        return 0
    return db.execute("SELECT COUNT(*) FROM payments WHERE sent_at IS NULL").fetchone()[0]


def job_exists(db: sqlite3.Connection, job_id: str) -> bool:
    return has_table(db, "jobs") and db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() is not None


def charges_since(db: sqlite3.Connection, since: float) -> list[tuple[float, str, int]]:
    """Each charge made since `since`: (when, backend, micro-USD), oldest first."""
    if not has_table(db, "ledger_entries"):
        return []
    rows = db.execute("SELECT at, backend, micro_usd FROM ledger_entries WHERE kind = 'charge' AND at >= ?"
                      " ORDER BY at, seq", (since,))
    return [(r[0], r[1], r[2]) for r in rows]


def budget_usage(db: sqlite3.Connection, budgets: Sequence[Budget], now: float) -> list[tuple[Budget, Usage]]:
    """Each budget with what it counts now (charged in its period + held), as the ledger counts it."""
    if not has_table(db, "ledger_entries"):
        return [(b, Usage(0, 0)) for b in budgets]
    return [(b, _usage(db, b, now)) for b in budgets]


def verdicts(db: sqlite3.Connection, limit: int) -> list[VerdictRow]:
    """The newest verdicts, with what each checked, why, and its evidence (as stored)."""
    if not has_table(db, "verdicts"):
        return []
    rows = db.execute("SELECT job_id, attempt_id, outcome, verdict_json, created_at FROM verdicts"
                      " ORDER BY id DESC LIMIT ?", (limit,))
    return [_verdict(r) for r in rows]


def _verdict(row: sqlite3.Row) -> VerdictRow:
    body = json.loads(row["verdict_json"])
    return VerdictRow(job_id=row["job_id"], attempt_id=row["attempt_id"], outcome=row["outcome"],
                      reasons=list(body.get("reasons", [])), checks=list(body.get("checks", [])),
                      evidence=dict(body.get("evidence", {})), created_at=row["created_at"])
