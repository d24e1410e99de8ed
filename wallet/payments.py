"""Payments to untrusted executors, exactly once: recorded with their charge, sent after, reconciled before a resend.

A payment is written in the same transaction as the ledger's charge it pays (`Ledger.charge(payment=…)`)
and keyed by it (`pay:<charge key>`), so an accepted attempt has a payment record exactly when it has a
charge. Sending is a later step: the broker first asks the `PaymentSender` whether the payment with that
key already went out (a process that died after sending and before recording it), and sends only if it
did not; then the transfer is recorded. A send and its record are not one transaction, so the sender is
what makes a resend safe: it must answer `sent(key)` for every transfer it made.

The table lives in the broker's SQLite file beside the ledger's, with its own schema version row.
The default sender, `ConclusionChannel`, moves no money of its own: the amount reaches the executor in the
signed receipt of its conclusion (broker/money/settlement.py), for whoever pays outside trainmaster.
`backends.yaml` `bittensor.payments: tao` picks `wallet/tao.py`'s `TaoSender`, a TAO transfer from the
broker's coldkey reconciled by its extrinsic hash before any resend.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Protocol

from trainmaster.storage import statedb

MIGRATIONS: list[list[str]] = [
    [  # 1
        """CREATE TABLE payments (
            key TEXT PRIMARY KEY,
            charge_key TEXT NOT NULL UNIQUE,
            job_id TEXT NOT NULL,
            attempt_id TEXT NOT NULL UNIQUE,
            payee TEXT NOT NULL,
            rao INTEGER NOT NULL CHECK (rao >= 0),
            created_at REAL NOT NULL,
            transfer TEXT,
            sent_at REAL,
            CHECK ((transfer IS NULL) = (sent_at IS NULL))
        )""",
        """CREATE TRIGGER payments_sent_once BEFORE UPDATE ON payments WHEN OLD.sent_at IS NOT NULL
           BEGIN SELECT RAISE(ABORT, 'a sent payment is never changed'); END""",
        """CREATE TRIGGER payments_no_delete BEFORE DELETE ON payments
           BEGIN SELECT RAISE(ABORT, 'payments are never deleted'); END""",
    ],
]


@dataclass(frozen=True)
class PaymentOrder:
    """What a charge pays an untrusted executor: its hotkey and the amount in rao."""

    attempt_id: str
    payee: str
    rao: int


@dataclass(frozen=True)
class Payment:
    """One row: `transfer` and `sent_at` are set once the sender made the transfer."""

    key: str
    charge_key: str
    job_id: str
    attempt_id: str
    payee: str
    rao: int
    created_at: float
    transfer: str | None
    sent_at: float | None


class PaymentSender(Protocol):
    """Moves the money of a payment. `send` makes the transfer under the payment's key and returns its id;
    `sent` returns that id when a transfer with this key was already made, else None (asked before any resend)."""

    async def sent(self, key: str) -> str | None: ...

    async def send(self, payment: Payment) -> str: ...


class ConclusionChannel:
    """No transfer of its own: the amount is told to the executor in its signed receipt (`payments: receipt`)."""

    async def sent(self, key: str) -> str | None:
        return None

    async def send(self, payment: Payment) -> str:
        return f"receipt:{payment.key}"


def migrate(db: sqlite3.Connection) -> None:
    """Create or upgrade the table, inside the caller's transaction."""
    statedb.migrate(db, version_table="payments_schema", migrations=MIGRATIONS, what="the payments")


def record(db: sqlite3.Connection, *, charge_key: str, job_id: str, order: PaymentOrder, at: float) -> None:
    """Write the payment of the charge `charge_key`, inside the charge's own transaction."""
    db.execute(
        "INSERT INTO payments (key, charge_key, job_id, attempt_id, payee, rao, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (f"pay:{charge_key}", charge_key, job_id, order.attempt_id, order.payee, order.rao, at),
    )


class Payments:
    """The payments on a connection to the broker's file (the table made by the ledger's migration)."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def for_attempt(self, attempt_id: str) -> Payment | None:
        row = self.db.execute("SELECT * FROM payments WHERE attempt_id = ?", (attempt_id,)).fetchone()
        return Payment(**dict(row)) if row else None

    def all(self, *, job_id: str | None = None) -> list[Payment]:
        sql, args = "SELECT * FROM payments", ()
        if job_id is not None:
            sql, args = sql + " WHERE job_id = ?", (job_id,)
        return [Payment(**dict(row)) for row in self.db.execute(sql + " ORDER BY created_at", args).fetchall()]

    def mark_sent(self, key: str, transfer: str) -> Payment:
        """Record the transfer of payment `key` (a second call with the same transfer changes nothing)."""
        with statedb.immediate(self.db) as db:
            row = db.execute("SELECT transfer FROM payments WHERE key = ?", (key,)).fetchone()
            if row is None:
                raise KeyError(f"no payment {key!r}")
            if row["transfer"] is None:
                db.execute("UPDATE payments SET transfer = ?, sent_at = ? WHERE key = ?", (transfer, time.time(), key))
            elif row["transfer"] != transfer:
                raise RuntimeError(f"payment {key!r} was already sent as {row['transfer']!r}, not {transfer!r}")
        return Payment(**dict(self.db.execute("SELECT * FROM payments WHERE key = ?", (key,)).fetchone()))


# What others read of the payments (`trainmaster status` and `spend`, the daemon's metrics), on a connection the
# caller holds: the one place outside `Payments` the table is named in SQL (tests/repo/test_sql_owners.py).

def payment_rows(db, *, job_id: str | None = None, pending_only: bool = False) -> list:
    """Every payment's row (of `job_id` when given), oldest first; only the unsent ones with `pending_only`."""
    sql, args = "SELECT * FROM payments", []
    where = []
    if job_id is not None:
        where.append("job_id = ?")
        args.append(job_id)
    if pending_only:
        where.append("sent_at IS NULL")
    if where:
        sql += " WHERE " + " AND ".join(where)
    return db.execute(sql + " ORDER BY created_at", args).fetchall()


def unsent(db) -> list[tuple[str, int]]:
    """(charge key, rao) of each payment charged but not sent yet."""
    return [(row[0], row[1]) for row in db.execute("SELECT charge_key, rao FROM payments WHERE sent_at IS NULL")]


def unsent_count(db) -> int:
    return db.execute("SELECT COUNT(*) FROM payments WHERE sent_at IS NULL").fetchone()[0]


def any_unsent(db) -> bool:
    """Whether a payment is charged but not sent yet (False before the table is made)."""
    return statedb.table_exists(db, "payments") and db.execute(
        "SELECT 1 FROM payments WHERE sent_at IS NULL LIMIT 1").fetchone() is not None
