"""Read-only views of the state database for `/metrics` and the dashboard.

Each caller opens the file read-only (`reading`), runs a few SELECTs and closes it; callers run
these off the event loop (`asyncio.to_thread`). A part whose tables are not made yet (the ledger
before the first reservation, the verdicts before the first verdict) reads as empty. The SQL is each part's own
(broker/store.py, wallet/ledger.py, wallet/payments.py, verify/records.py): nothing here names a table in SQL.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from trainmaster.broker import states, store
from trainmaster.storage import statedb
from trainmaster.verify import records
from trainmaster.wallet import payments
from trainmaster.wallet.budget import Budget
from trainmaster.wallet import ledger
from trainmaster.wallet.ledger import Usage


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
        counts.update(store.job_counts(db))
    return counts


def charged_by_backend(db: sqlite3.Connection) -> list[BackendSpend]:
    """What was charged on each backend, ever (the ledger's `charge` rows)."""
    return [BackendSpend(*r) for r in ledger.charged_by_backend(db)]


def reserved_by_backend(db: sqlite3.Connection) -> list[BackendSpend]:
    """What is held now on each backend: reservations not yet charged or released."""
    return [BackendSpend(*r) for r in ledger.reserved_by_backend(db)]


def verdict_counts(db: sqlite3.Connection) -> dict[str, int]:
    """Verdicts recorded per outcome (every outcome named; a re-verification counts again)."""
    counts = {"accepted": 0, "rejected": 0, "cannot_verify": 0}
    if has_table(db, "verdicts"):
        counts.update(records.verdict_counts(db))
    return counts


def queue_latencies(db: sqlite3.Connection) -> list[float]:
    """Seconds from each job's submission to its first dispatch (jobs never dispatched are left out)."""
    if not has_table(db, "jobs"):
        return []
    return store.queue_latencies(db)


def jobs(db: sqlite3.Connection, limit: int, offset: int = 0) -> list[JobRow]:
    """The newest jobs (from the `offset`-th on) with the backend of their latest attempt that started (a job that
    never ran shows none) and what they cost (an untrusted executor's work that was not accepted costs nothing)."""
    if not has_table(db, "jobs"):
        return []
    rows = store.newest_jobs(db, limit, offset)
    return [JobRow(id=r["id"], name=r["name"], state=r["state"], reason=r["reason"], backend=r["backend"],
                   cost_micro_usd=r["cost"], created_at=r["created_at"], updated_at=r["updated_at"]) for r in rows]


def job_total(db: sqlite3.Connection) -> int:
    return store.job_total(db) if has_table(db, "jobs") else 0


def failed_since(db: sqlite3.Connection, since: float) -> int:
    """Jobs that ended failed at or after `since`."""
    if not has_table(db, "jobs"):
        return 0
    return store.failed_since(db, since)


def unsent_payments(db: sqlite3.Connection) -> int:
    """Payments charged but not sent yet (pending: broker/payment_states.py)."""
    if not has_table(db, "payments"):
        return 0
    return payments.unsent_count(db)


def job_exists(db: sqlite3.Connection, job_id: str) -> bool:
    return has_table(db, "jobs") and store.job_exists(db, job_id)


def charges_since(db: sqlite3.Connection, since: float) -> list[tuple[float, str, int]]:
    """Each charge made since `since`: (when, backend, micro-USD), oldest first."""
    return ledger.charges_since(db, since)


def budget_usage(db: sqlite3.Connection, budgets: Sequence[Budget], now: float) -> list[tuple[Budget, Usage]]:
    """Each budget with what it counts now (charged in its period + held), as the ledger counts it."""
    return [(b, ledger.usage(db, b, now)) for b in budgets]


def verdicts(db: sqlite3.Connection, limit: int) -> list[VerdictRow]:
    """The newest verdicts, with what each checked, why, and its evidence (as stored)."""
    if not has_table(db, "verdicts"):
        return []
    return [_verdict(r) for r in records.newest_verdicts(db, limit)]


def _verdict(row: sqlite3.Row) -> VerdictRow:
    body = json.loads(row["verdict_json"])
    return VerdictRow(job_id=row["job_id"], attempt_id=row["attempt_id"], outcome=row["outcome"],
                      reasons=list(body.get("reasons", [])), checks=list(body.get("checks", [])),
                      evidence=dict(body.get("evidence", {})), created_at=row["created_at"])
