"""One daemon per state: an exclusive lock its daemon holds for as long as it runs.

- SQLite state: an `flock` on `<state.db>.daemon-lock`, a file beside the database (one host shares a SQLite file),
  which holds the holder's description. The kernel drops the lock when its process dies, `kill -9` included.
- PostgreSQL state: a session advisory lock on a connection of its own, held for the daemon's life; the holder
  describes itself in `daemon_instance` (schema part `daemon_instance_schema`). The server drops the lock when the
  session ends (the holder died, or the server restarted): `still_held` takes it again on a new session, and says
  when another daemon took it meanwhile (the daemon then stops: the state is that one's now).

A second daemon started on the same state fails at once, with `Held` naming the holder: its pid, host, address
and start time.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from trainmaster.storage import statedb

LOCK_SUFFIX = ".daemon-lock"
ADVISORY_CLASS = 3
"""The advisory-lock namespace (first int4 key) of the daemon's lock (1: transaction locks; 2: job locks)."""
ADVISORY_NAME = "trainmaster daemon"

MIGRATIONS: list[list[str]] = [
    ["CREATE TABLE daemon_instance (id INTEGER PRIMARY KEY, pid INTEGER NOT NULL, host TEXT NOT NULL,"
     " address TEXT NOT NULL, started_at REAL NOT NULL)"],
]


class Held(RuntimeError):
    """Another daemon holds the state; the message names it."""


def describe(holder: dict | None) -> str:
    if not holder:
        return "another daemon (it did not say which)"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started_at", 0)))
    address = holder.get("address") or "not listening yet"
    return f"pid {holder.get('pid')} on {holder.get('host')}, {address}, since {since}"


def me(address: str = "") -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "address": address, "started_at": time.time()}


class InstanceLock:
    """The state's daemon lock, held by this process (`take`), described by `holder` (`announce`)."""

    def __init__(self, where: Path | str):
        self.where = where
        self.holder = me()
        self._fd: int | None = None
        self._db = None

    # taking and keeping

    def take(self) -> None:
        """Take the lock, or raise `Held` naming the daemon that has it (`OperationalError`: database away)."""
        if statedb.is_server(self.where):
            self._take_advisory()
        else:
            self._take_file()

    def announce(self, address: str) -> None:
        """Record the address the holder listens on, for a second start to name."""
        self.holder = {**self.holder, "address": address}
        if self._fd is not None:
            self._write_file()
        elif self._db is not None:
            self._write_row(self._db)

    def still_held(self) -> bool:
        """PostgreSQL: whether this daemon still holds the lock, taking it again on a new session when the server
        dropped the old one; False when another daemon took it meanwhile. `OperationalError` while the server is
        away. SQLite: always (the file lock lives as long as the process)."""
        if self._db is None:
            return True
        held = self._db.execute(f"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = {ADVISORY_CLASS}"
                                f" AND objid = hashtext('{ADVISORY_NAME}')::oid AND objsubid = 2"
                                " AND pid = pg_backend_pid() AND granted").fetchone()[0]
        if held:
            return True
        if not self._try_advisory(self._db):
            return False
        self._write_row(self._db)
        return True

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # the flock goes with the last descriptor
            self._fd = None
        if self._db is not None:
            with contextlib.suppress(statedb.Error):
                self._db.close()  # the session ends: its lock goes with it
            self._db = None

    # SQLite: a file lock

    def lock_file(self) -> Path:
        return Path(str(self.where) + LOCK_SUFFIX)

    def _take_file(self) -> None:
        path = self.lock_file()
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise Held(f"a daemon already runs on this state ({self.where}): {describe(holder)}") from None
        self._fd = fd
        self._write_file()

    def _write_file(self) -> None:
        data = json.dumps(self.holder).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    # PostgreSQL: a session advisory lock

    def _take_advisory(self) -> None:
        db = statedb.connect(self.where)
        try:
            with statedb.immediate(db) as tx:
                statedb.migrate(tx, version_table="daemon_instance_schema", migrations=MIGRATIONS,
                                what="the daemon's instance record")
            if not self._try_advisory(db):
                row = db.execute("SELECT pid, host, address, started_at FROM daemon_instance WHERE id = 1").fetchone()
                raise Held(f"a daemon already runs on this state ({statedb.shown(self.where)}): "
                           f"{describe(dict(row) if row else None)}")
        except BaseException:
            db.close()
            raise
        self._db = db
        self._write_row(db)

    @staticmethod
    def _try_advisory(db) -> bool:
        return bool(db.execute(f"SELECT pg_try_advisory_lock({ADVISORY_CLASS}, hashtext('{ADVISORY_NAME}'))")
                    .fetchone()[0])

    def _write_row(self, db) -> None:
        h = self.holder
        db.execute("INSERT INTO daemon_instance (id, pid, host, address, started_at) VALUES (1, ?, ?, ?, ?)"
                   " ON CONFLICT (id) DO UPDATE SET pid = excluded.pid, host = excluded.host,"
                   " address = excluded.address, started_at = excluded.started_at",
                   (h["pid"], h["host"], h["address"], h["started_at"]))


def _read_holder(fd: int) -> dict | None:
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"null")
    except (OSError, ValueError):
        return None
