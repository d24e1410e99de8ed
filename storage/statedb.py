"""SQLite plumbing shared by the broker's store, the ledger and the verdict records.

They share one file (`state.db`), in WAL mode, and each part keeps its own versioned schema in
its own version table, so each can migrate without knowing the others. Write transactions are
taken up front (BEGIN IMMEDIATE) so that check-then-write is atomic across processes.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


class SchemaTooNew(RuntimeError):
    """The file was written by a newer trainmaster."""


def connect(path: Path | str) -> sqlite3.Connection:
    """An autocommit connection (transactions are explicit) with named rows, WAL and a 30 s busy wait.

    A new file is created readable by its owner only (0600; its folder 0700), whatever the umask: it
    holds job environments and challenge secrets. SQLite gives its `-wal` and `-shm` files the mode of
    the database file."""
    path = Path(path)
    if str(path) != ":memory:":
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _create_private(path)
    db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA busy_timeout=30000")
    db.execute("PRAGMA foreign_keys=ON")
    return db


def _create_private(path: Path) -> None:
    """Create the database file 0600 if it does not exist yet. Never opens an existing one: closing any
    descriptor of a file drops every POSIX lock this process holds on it, SQLite's included, so opening
    and closing a database another connection of this process uses would corrupt its locking."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | getattr(os, "O_CLOEXEC", 0), 0o600))
    except FileExistsError:
        pass


@contextmanager
def immediate(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction, rolled back on any error."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def migrate(db: sqlite3.Connection, *, version_table: str, migrations: Sequence[Sequence[str]], what: str) -> None:
    """Apply the migrations after the recorded version, inside the caller's transaction.

    `migrations[i]` holds the statements that take the schema from version i to i + 1.
    """
    db.execute(f"CREATE TABLE IF NOT EXISTS {version_table} (version INTEGER NOT NULL)")
    row = db.execute(f"SELECT version FROM {version_table}").fetchone()
    current = row[0] if row else 0
    if current > len(migrations):
        raise SchemaTooNew(
            f"{what} has schema version {current}, newer than this trainmaster knows ({len(migrations)}); "
            "upgrade trainmaster"
        )
    for statements in migrations[current:]:
        for statement in statements:
            db.execute(statement)
    if row is None:
        db.execute(f"INSERT INTO {version_table} (version) VALUES (?)", (len(migrations),))
    elif current < len(migrations):
        db.execute(f"UPDATE {version_table} SET version = ?", (len(migrations),))
