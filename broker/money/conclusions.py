"""The conclusions' records: each untrusted attempt's signed receipt and, once its executor acknowledged it, the
executor's countersignature. In the state database in their own table, with their own schema version row
(`settlement_schema`); settlement (broker/money/settlement.py) writes them, the store asks which attempts still
await one. The one module that names the table in SQL (tests/repo/test_sql_owners.py).
"""

from __future__ import annotations

import time

from trainmaster.storage import statedb

MIGRATIONS: list[list[str]] = [
    [  # 1
        """CREATE TABLE conclusions (
            attempt_id TEXT PRIMARY KEY,
            job_id TEXT NOT NULL,
            receipt TEXT NOT NULL,
            signature TEXT NOT NULL,
            countersignature TEXT,
            created_at REAL NOT NULL,
            acknowledged_at REAL
        )""",
    ],
]
TABLE = "conclusions"


def migrate(db) -> None:
    with statedb.immediate(db) as tx:
        statedb.migrate(tx, version_table="settlement_schema", migrations=MIGRATIONS, what="the settlements")


def acknowledged(db, attempt_ids: list[str]) -> set[str]:
    """Those of `attempt_ids` whose executor countersigned its receipt (none before the table is made)."""
    if not attempt_ids or not statedb.table_exists(db, TABLE):
        return set()
    found: set[str] = set()
    for i in range(0, len(attempt_ids), 500):  # within any database's limit on parameters
        chunk = attempt_ids[i:i + 500]
        found |= {row[0] for row in db.execute(
            f"SELECT attempt_id FROM conclusions WHERE countersignature IS NOT NULL"
            f" AND attempt_id IN ({','.join('?' * len(chunk))})", chunk)}
    return found


def stored(db, attempt_id: str):
    """The attempt's row (attempt_id, job_id, receipt, signature, countersignature, created_at, acknowledged_at)."""
    return db.execute("SELECT * FROM conclusions WHERE attempt_id = ?", (attempt_id,)).fetchone()


def issue(db, attempt_id: str, job_id: str, receipt: str, signature: str) -> None:
    """Store a receipt once (a second process keeps the first one stored)."""
    with statedb.immediate(db) as tx:
        tx.execute("INSERT INTO conclusions (attempt_id, job_id, receipt, signature, created_at)"
                   " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING", (attempt_id, job_id, receipt, signature, time.time()))


def countersigned(db, attempt_id: str, countersignature: str) -> None:
    """Record the executor's countersignature of the attempt's receipt, once."""
    with statedb.immediate(db) as tx:
        tx.execute("UPDATE conclusions SET countersignature = ?, acknowledged_at = ? WHERE attempt_id = ?"
                   " AND countersignature IS NULL", (countersignature, time.time(), attempt_id))
