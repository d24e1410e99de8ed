"""Job leases in the state database: which reconciler may advance a job now.

A lease is a row (job id, holder, expires_at). Its times come from the DATABASE's clock, never the
caller's, so reconcilers on machines whose clocks disagree still agree on who holds a job. A claim is
one statement that takes the row when it is free, expired, or already this holder's; a holder renews
its leases while it works and releases them when it is done. A holder that dies (kill -9) releases
nothing: its leases expire after their time to live, and another reconciler takes the job over (the
broker's state machine is idempotent, so the step it redoes records nothing twice).

The table is its own schema part (`daemon_leases_schema`), beside the store's, the ledger's and the
verify records' parts, so it migrates without knowing them.
"""

from __future__ import annotations

import threading
from pathlib import Path

from trainmaster.storage import statedb

NOW = "((julianday('now') - 2440587.5) * 86400.0)"
"""The database's clock in Unix seconds (SQLite < 3.42 has no `unixepoch('subsec')`)."""

MIGRATIONS: list[list[str]] = [
    [  # 1: one lease per job
        "CREATE TABLE job_leases (job_id TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at REAL NOT NULL)",
    ],
]


class Leases:
    """The leases on the state database at `path`, over a connection of their own (safe from threads)."""

    def __init__(self, path: Path | str):
        self.db = statedb.connect(path)
        self._lock = threading.Lock()
        with self._lock, statedb.immediate(self.db) as db:
            statedb.migrate(db, version_table="daemon_leases_schema", migrations=MIGRATIONS, what="the job leases")

    def close(self) -> None:
        self.db.close()

    def claim(self, job_id: str, holder: str, ttl_s: float) -> bool:
        """Take the job's lease for `ttl_s` seconds; False when another holder's lease has not expired."""
        with self._lock, statedb.immediate(self.db) as db:
            db.execute(
                f"INSERT INTO job_leases (job_id, holder, expires_at) VALUES (?, ?, {NOW} + ?)"
                " ON CONFLICT (job_id) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at"
                f" WHERE job_leases.expires_at <= {NOW} OR job_leases.holder = excluded.holder",
                (job_id, holder, ttl_s),
            )
            return db.execute("SELECT changes()").fetchone()[0] == 1

    def renew(self, job_id: str, holder: str, ttl_s: float) -> bool:
        """Extend a lease this holder still has; False when it lost it (it expired and another took it)."""
        with self._lock, statedb.immediate(self.db) as db:
            db.execute(f"UPDATE job_leases SET expires_at = {NOW} + ? WHERE job_id = ? AND holder = ?",
                       (ttl_s, job_id, holder))
            return db.execute("SELECT changes()").fetchone()[0] == 1

    def release(self, job_id: str, holder: str) -> None:
        """Give the job's lease up (nothing when another holder has it)."""
        with self._lock, statedb.immediate(self.db) as db:
            db.execute("DELETE FROM job_leases WHERE job_id = ? AND holder = ?", (job_id, holder))

    def holder(self, job_id: str) -> str | None:
        """Who holds a live lease on the job now, if anyone."""
        with self._lock:
            row = self.db.execute(f"SELECT holder FROM job_leases WHERE job_id = ? AND expires_at > {NOW}",
                                  (job_id,)).fetchone()
        return row[0] if row else None

    def live(self) -> int:
        """How many leases are live now (jobs being advanced by some reconciler)."""
        with self._lock:
            return self.db.execute(f"SELECT count(*) FROM job_leases WHERE expires_at > {NOW}").fetchone()[0]
