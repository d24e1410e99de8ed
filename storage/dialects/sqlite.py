"""SQLite: the embedded default, one file in WAL mode (the standard library's driver, unwrapped for speed).

A write transaction is `BEGIN IMMEDIATE`: SQLite has one writer at a time, so a check and the write that
depends on it are atomic across threads and processes. DDL is written in SQLite's own words, so migrations
run as they are written.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from pathlib import Path

NAME = "sqlite"

NOW = "((julianday('now') - 2440587.5) * 86400.0)"
"""The database's clock in Unix seconds (SQLite < 3.42 has no `unixepoch('subsec')`)."""


BUSY_WAIT_S = 30.0
"""How long a connection waits for another's lock: SQLite's busy wait, and turning a new file to WAL (`_wal`)."""


class Connection(sqlite3.Connection):
    """sqlite3's own connection, with the dialect and the file it opened attached."""



Connection.dialect = sys.modules[__name__]


def connect(path: Path | str) -> Connection:
    """An autocommit connection (transactions are explicit) with named rows, WAL and a 30 s busy wait.

    A new file is created readable by its owner only (0600; its folder 0700), whatever the umask: it
    holds job environments and challenge secrets. SQLite gives its `-wal` and `-shm` files the mode of
    the database file."""
    path = Path(path)
    if str(path) != ":memory:":
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _create_private(path)
    db = sqlite3.connect(path, timeout=BUSY_WAIT_S, isolation_level=None, check_same_thread=False, factory=Connection)
    db.row_factory = sqlite3.Row
    _wal(db)
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(f"PRAGMA busy_timeout={int(BUSY_WAIT_S * 1000)}")
    db.execute("PRAGMA foreign_keys=ON")
    return db


def _wal(db: Connection) -> None:
    """WAL mode. Turning a new file to WAL takes its exclusive lock, and SQLite answers "database is locked" at once,
    without its busy wait, when another connection opening the same file holds its shared lock (waiting there could
    deadlock): several processes opening a new home at one moment (concurrent `submit`s) retry here, briefly, until
    one has turned it; for the others it then already is WAL."""
    deadline, pause = time.monotonic() + BUSY_WAIT_S, 0.005
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.2)


def _create_private(path: Path) -> None:
    """Create the database file 0600 if it does not exist yet. Never opens an existing one: closing any
    descriptor of a file drops every POSIX lock this process holds on it, SQLite's included, so opening
    and closing a database another connection of this process uses would corrupt its locking."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | getattr(os, "O_CLOEXEC", 0), 0o600))
    except FileExistsError:
        pass


FOR_UPDATE = ""
"""Row locks: none to take, the write transaction already holds the only write lock."""


def begin(db: Connection, *, serialized: bool) -> None:
    """A write transaction: SQLite has one writer at a time, so it is always serialized."""
    db.execute("BEGIN IMMEDIATE")


def lock_key(db: Connection, key: str) -> None:
    """Nothing to do: the write transaction already holds the only write lock."""


def where(db: sqlite3.Connection) -> str:
    """The file the connection opened ("" in memory)."""
    return db.execute("PRAGMA database_list").fetchone()[2]


def table_exists(db: Connection, name: str) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None


def month(column: str) -> str:
    """The `YYYY-MM` (UTC) of a Unix-seconds column."""
    return f"strftime('%Y-%m', {column}, 'unixepoch')"


def json_text(column: str, *keys: str) -> str:
    """The value at `keys` in a JSON text column, as text."""
    return f"json_extract({column}, '$.{'.'.join(keys)}')"


def render(statement: str) -> list[str]:
    """Migrations are written in SQLite's words: each runs as written."""
    return [statement]
