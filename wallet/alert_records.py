"""The budget alerts' records: each threshold a budget crossed in a period, once, with its webhook delivery
(`ledger_alerts`, in the ledger's schema: wallet/ledger.py's migrations hold these statements). The ledger records
an alert inside the movement's transaction; the outbox (wallet/outbox.py) delivers the pending ones. The one module
that names the table in SQL (tests/repo/test_sql_owners.py).
"""

from __future__ import annotations

CREATE = """CREATE TABLE ledger_alerts (
            budget TEXT NOT NULL,
            period_start REAL NOT NULL,
            percent INTEGER NOT NULL,
            used_micro_usd INTEGER NOT NULL,
            at REAL NOT NULL,
            PRIMARY KEY (budget, period_start, percent)
        )"""
"""The ledger's migration 1 makes it."""
DELIVERY = [
    "ALTER TABLE ledger_alerts ADD COLUMN webhook TEXT",
    "ALTER TABLE ledger_alerts ADD COLUMN payload TEXT",
    "ALTER TABLE ledger_alerts ADD COLUMN delivered_at REAL",
    "ALTER TABLE ledger_alerts ADD COLUMN tries INTEGER NOT NULL DEFAULT 0",
]
"""The ledger's migration 2: webhook delivery, at least once; earlier alerts had no record of it."""

_WHERE_PENDING = "WHERE webhook IS NOT NULL AND delivered_at IS NULL AND tries < ?"


def record(db, *, budget: str, period_start: float, percent: int, used_micro_usd: int, at: float,
           webhook: str | None, payload: str) -> bool:
    """Record an alert once per budget, period and threshold; whether it is new."""
    return bool(db.execute(
        "INSERT INTO ledger_alerts (budget, period_start, percent, used_micro_usd, at, webhook, payload)"
        " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        (budget, period_start, percent, used_micro_usd, at, webhook, payload),
    ).rowcount)


def has_pending(db, max_tries: int) -> bool:
    """Whether an alert with a webhook is still to deliver (tried fewer than `max_tries` times)."""
    return db.execute(f"SELECT 1 FROM ledger_alerts {_WHERE_PENDING} LIMIT 1", (max_tries,)).fetchone() is not None


def pending(db, max_tries: int) -> list[tuple]:
    """(budget, period_start, percent, webhook, payload) of each alert still to deliver, oldest first."""
    return db.execute(f"SELECT budget, period_start, percent, webhook, payload FROM ledger_alerts {_WHERE_PENDING}"
                      " ORDER BY at", (max_tries,)).fetchall()


def tried(db, budget: str, period_start: float, percent: int, delivered_at: float | None) -> None:
    """Count a delivery try of the alert, and mark it delivered (`delivered_at`) when it was."""
    db.execute("UPDATE ledger_alerts SET tries = tries + 1, delivered_at = ?"
               " WHERE budget = ? AND period_start = ? AND percent = ?", (delivered_at, budget, period_start, percent))
