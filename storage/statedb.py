"""SQLite plumbing shared by the broker's store, the ledger and the verdict records.

They share one file (`state.db`), in WAL mode, and each part keeps its own versioned schema in
its own version table, so each can migrate without knowing the others. Write transactions are
taken up front (BEGIN IMMEDIATE) so that check-then-write is atomic across processes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


class SchemaTooNew(RuntimeError):
    """The file was written by a newer trainmaster."""


def connect(path: Path | str) -> sqlite3.Connection:
    """An autocommit connection (transactions are explicit) with named rows, WAL and a 30 s busy wait."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA busy_timeout=30000")
    db.execute("PRAGMA foreign_keys=ON")
    return db


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
