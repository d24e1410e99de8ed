"""A payment that could not be sent now: why, how often it was tried, and when it is tried next.

Sending a payment (wallet/payments.py, wallet/tao.py) can fail for reasons that pass: the chain is unreachable,
the transfer is not in a block yet, the coldkey cannot be unlocked at this terminal, the balance is short. Such a
payment stays **pending**: its charge is recorded, its money has not moved, and the next reconcile pass (the
daemon's, or the background pass a read starts) once its retry time has come tries again. The sender reconciles by the payment's key before any
resend, so however many tries it takes, it is paid exactly once.

Each failed try is recorded here (one row per payment, in the broker's database beside `payments`), so `status`,
`spend` and the dashboard can say what is pending, why, and when it is tried next; a try is never made before
`next_try_at`, so a chain that is down costs each later pass nothing. The waits double from RETRY_FIRST_S
up to RETRY_MOST_S.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass

from trainmaster.storage import statedb

RETRY_FIRST_S = 30.0
RETRY_MOST_S = 3600.0
MIGRATIONS: list[list[str]] = [
    [  # 1
        """CREATE TABLE payment_tries (
            payment_key TEXT PRIMARY KEY,
            tries INTEGER NOT NULL,
            reason TEXT NOT NULL,
            last_try_at REAL NOT NULL,
            next_try_at REAL NOT NULL
        )""",
    ],
]


@dataclass(frozen=True)
class PendingTry:
    """The latest failed try of a payment not yet sent."""

    payment_key: str
    tries: int
    reason: str
    last_try_at: float
    next_try_at: float


def delay_after(tries: int) -> float:
    """Seconds to wait after the `tries`-th failed try."""
    return min(RETRY_MOST_S, RETRY_FIRST_S * 2 ** max(0, tries - 1))


class PaymentTries:
    """The failed tries of unsent payments, on a connection to the broker's database."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db
        with statedb.immediate(db) as tx:
            statedb.migrate(tx, version_table="payment_tries_schema", migrations=MIGRATIONS, what="the payment tries")

    def get(self, key: str) -> PendingTry | None:
        row = self.db.execute("SELECT * FROM payment_tries WHERE payment_key = ?", (key,)).fetchone()
        return PendingTry(**dict(row)) if row else None

    def due(self, key: str, now: float | None = None) -> bool:
        """Whether payment `key` may be tried now (never tried, or its retry time has come)."""
        found = self.get(key)
        return found is None or found.next_try_at <= (time.time() if now is None else now)

    def failed(self, key: str, reason: str, now: float | None = None) -> PendingTry:
        """Record a failed try of payment `key`, and when the next one is due."""
        now = time.time() if now is None else now
        with statedb.immediate(self.db) as db:
            row = db.execute("SELECT tries FROM payment_tries WHERE payment_key = ?", (key,)).fetchone()
            tries = (row[0] if row else 0) + 1
            values = (tries, reason[:2000], now, now + delay_after(tries), key)
            if row:
                db.execute("UPDATE payment_tries SET tries = ?, reason = ?, last_try_at = ?, next_try_at = ?"
                           " WHERE payment_key = ?", values)
            else:
                db.execute("INSERT INTO payment_tries (tries, reason, last_try_at, next_try_at, payment_key)"
                           " VALUES (?, ?, ?, ?, ?)", values)
        return self.get(key)


def read_tries(db, keys: list[str]) -> dict[str, PendingTry]:
    """The recorded failed tries of `keys` (none when the table was never made: nothing ever failed)."""
    if not keys or not statedb.table_exists(db, "payment_tries"):
        return {}
    marks = ", ".join("?" for _ in keys)
    rows = db.execute(f"SELECT * FROM payment_tries WHERE payment_key IN ({marks})", keys).fetchall()
    return {row["payment_key"]: PendingTry(**dict(row)) for row in rows}
