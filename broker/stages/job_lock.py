"""A job's lock, so two brokers never dispatch or settle the same job at once: a file lock beside a SQLite state
file (one host), a session advisory lock of the database server when the state is on one (any host)."""

from __future__ import annotations

import asyncio
import fcntl
from contextlib import asynccontextmanager
from pathlib import Path

from trainmaster.broker import paths
from trainmaster.storage import statedb


class JobLocks:
    """The locks of the jobs of one state database."""

    def __init__(self, db_path: Path | str):
        self.db_path = db_path
        self._session_locks = None
        """The server's session locks on jobs, when the state is on PostgreSQL (made on first use)."""

    def held(self, job_id: str):
        """An async context manager that holds the job's lock."""
        if not statedb.is_server(self.db_path):
            return locked(paths.job_dir(job_id) / ".lock")
        if self._session_locks is None:
            from trainmaster.storage.dialects import postgresql

            self._session_locks = postgresql.SessionLocks(self.db_path)
        return self._session_locks.hold(f"job:{job_id}")

    def close(self) -> None:
        if self._session_locks is not None:
            self._session_locks.close()


@asynccontextmanager
async def locked(path: Path):
    """An exclusive lock across processes (and coroutines), so two brokers never dispatch or settle
    the same job at once. Polled without blocking, so a daemon's loop keeps running while it waits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(0.02)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
