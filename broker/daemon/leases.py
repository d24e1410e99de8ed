"""Job leases in the state database: which reconciler may advance a job now.

A lease is a row (job id, holder, expires_at). Its times come from the DATABASE's clock (its dialect's
`NOW`: `clock_timestamp()` on PostgreSQL), never the caller's, so reconcilers on machines whose clocks
disagree still agree on who holds a job. A claim is one statement (`statedb.single_write`: one round trip
on a server), an upsert whose update has a WHERE, that takes the row when it is free, expired, or already
this holder's (on PostgreSQL the row lock of the conflicting row makes two claims of one job take turns: the
second sees the first's lease); a holder renews its leases while it works and releases them when it is done.
A holder that dies (kill -9) releases nothing: its leases expire after their time to live, and another
reconciler takes the job over (the broker's state machine is idempotent, so the step it redoes records
nothing twice).

The table is its own schema part (`daemon_leases_schema`), beside the store's, the ledger's and the
verify records' parts, so it migrates without knowing them.
"""

from __future__ import annotations

import threading
from pathlib import Path

from trainmaster.storage import statedb

MIGRATIONS: list[list[str]] = [
    [  # 1: one lease per job
        "CREATE TABLE job_leases (job_id TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at REAL NOT NULL)",
    ],
]


class Leases:
    """The leases on the state database at `path`, over a connection of their own (safe from threads)."""

    def __init__(self, path: Path | str):
        self.db = statedb.connect(path)
        self._now = statedb.dialect(self.db).NOW  # the database's clock, in Unix seconds
        self._lock = threading.Lock()
        with self._lock, statedb.immediate(self.db) as db:
            statedb.migrate(db, version_table="daemon_leases_schema", migrations=MIGRATIONS, what="the job leases")

    def close(self) -> None:
        self.db.close()

    def claim(self, job_id: str, holder: str, ttl_s: float) -> bool:
        """Take the job's lease for `ttl_s` seconds; False when another holder's lease has not expired."""
        with self._lock, statedb.single_write(self.db) as db:
            return db.execute(
                f"INSERT INTO job_leases (job_id, holder, expires_at) VALUES (?, ?, {self._now} + ?)"
                " ON CONFLICT (job_id) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at"
                f" WHERE job_leases.expires_at <= {self._now} OR job_leases.holder = excluded.holder",
                (job_id, holder, ttl_s),
            ).rowcount == 1

    def renew(self, job_id: str, holder: str, ttl_s: float) -> bool:
        """Extend a lease this holder still has; False when it lost it (it expired and another took it)."""
        with self._lock, statedb.single_write(self.db) as db:
            return db.execute(f"UPDATE job_leases SET expires_at = {self._now} + ? WHERE job_id = ? AND holder = ?",
                              (ttl_s, job_id, holder)).rowcount == 1

    def release(self, job_id: str, holder: str) -> None:
        """Give the job's lease up (nothing when another holder has it)."""
        with self._lock, statedb.single_write(self.db) as db:
            db.execute("DELETE FROM job_leases WHERE job_id = ? AND holder = ?", (job_id, holder))

    def holder(self, job_id: str) -> str | None:
        """Who holds a live lease on the job now, if anyone."""
        with self._lock:
            row = self.db.execute(f"SELECT holder FROM job_leases WHERE job_id = ? AND expires_at > {self._now}",
                                  (job_id,)).fetchone()
        return row[0] if row else None

    def live(self) -> int:
        """How many leases are live now (jobs being advanced by some reconciler)."""
        with self._lock:
            return self.db.execute(f"SELECT count(*) FROM job_leases WHERE expires_at > {self._now}").fetchone()[0]
