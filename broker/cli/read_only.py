"""The state read from a disk that cannot take a write (full to the last byte): reads keep working.

SQLite in WAL mode writes even to open a database (its `-shm` file), so on a full disk the store cannot be opened
as usual. This opens the file read-only and `immutable` (no locks, no `-shm`): what the last writer checkpointed
into the main file, which is every change once the commands that made them have ended. Only for SQLite: a
database server answers reads whatever this disk holds. Nothing here writes.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from trainmaster.broker.store import Store


class ReadOnlyStore(Store):
    """A Store whose connection can only read (its write methods fail with sqlite3.OperationalError)."""

    read_only = True

    def __init__(self, path: Path):
        self.path, self.transactions = path, 0
        self.db = sqlite3.connect(f"{Path(path).absolute().as_uri()}?mode=ro&immutable=1", uri=True, timeout=30,
                                  isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row


def disk_full_under(path: Path | str) -> bool:
    """Whether the disk holding `path` (a state file) has next to nothing free (under 1 MiB)."""
    if not isinstance(path, Path):
        return False
    where = path if path.exists() else path.parent
    try:
        info = os.statvfs(where)
    except OSError:
        return False
    return info.f_bavail * info.f_frsize < 2**20
