"""Read a state database the way the end-to-end tests check it: rows of a query, by column name."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def state_rows(where: Path, sql: str, *args) -> list[sqlite3.Row]:
    """The rows of `sql` on a SQLite file: a broker's home (its `state.db`), or a database file (a miner's `miner.db`)."""
    db = sqlite3.connect(where / "state.db" if Path(where).is_dir() else where)
    db.row_factory = sqlite3.Row
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()
