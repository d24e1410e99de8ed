"""The state database shared by the broker's store, the ledger and the verdict records.

Where it lives is a location: a path (a SQLite file, the embedded default, in WAL mode) or a
`postgresql://` URL (a team server; storage/dialects/ holds one module per database). Each part keeps its
own versioned schema in its own version table, so each can migrate without knowing the others. Write
transactions are taken up front (`immediate`: BEGIN IMMEDIATE on SQLite, an advisory lock on PostgreSQL)
so that check-then-write is atomic across processes.

Errors are the DB-API classes of `sqlite3` (`Error`, `IntegrityError`, `OperationalError`) whatever the
database: the PostgreSQL connection raises its driver's errors as these.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from trainmaster.storage.dialects import sqlite

Error = sqlite3.Error
IntegrityError = sqlite3.IntegrityError
OperationalError = sqlite3.OperationalError

SCHEMES = ("sqlite:///", "postgresql://", "postgres://")


class SchemaTooNew(RuntimeError):
    """The database was written by a newer trainmaster."""


class BadDatabaseUrl(ValueError):
    """A database URL of no kind we open."""


def location(url: str) -> Path | str:
    """What a database URL names: `sqlite:////abs/path.db` → that file's path; `postgresql://…` → the URL."""
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if not path.startswith("/"):
            raise BadDatabaseUrl(f"{url!r}: a SQLite URL names an absolute path, as in sqlite:////home/me/state.db")
        return Path(path)
    if url.startswith(("postgresql://", "postgres://")):
        return url
    raise BadDatabaseUrl(f"{url!r} is not a database URL: use sqlite:////absolute/path.db or postgresql://user@host:port/db")


def is_server(where: Path | str) -> bool:
    """Whether a location names a database server rather than a file."""
    return isinstance(where, str) and where.startswith(("postgresql://", "postgres://"))


def shown(where: Path | str) -> str:
    """A location as it may be printed: a server URL's password masked."""
    if not is_server(where):
        return str(where)
    from urllib.parse import urlsplit

    parts = urlsplit(where)
    if parts.password is None:
        return where
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)).geturl()


def connect(where: Path | str) -> Any:
    """A connection (autocommit; transactions are explicit) to a location: a path or a `postgresql://` URL."""
    if is_server(where):
        from trainmaster.storage.dialects import postgresql

        return postgresql.connect(where)
    if str(where).startswith(("postgresql:", "postgres:")):  # a URL made a Path ("//" collapsed): never a file
        raise BadDatabaseUrl(f"{where}: a database URL was passed as a path (a bug: locations stay strings)")
    return sqlite.connect(where)


@contextmanager
def immediate(db, *, serialized: bool = True) -> Iterator[Any]:
    """One write transaction, taken up front, rolled back on any error. `serialized` (the default): one
    writer at a time, so check-then-write is atomic; False: the caller locks the rows it depends on (its
    dialect's `FOR_UPDATE`, `lock_key`), which SQLite's single writer does anyway."""
    dialect(db).begin(db, serialized=serialized)
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def single_write(db) -> AbstractContextManager[Any]:
    """A write that is one statement, atomic by itself: on a server it runs as it is, in autocommit (one
    round trip, not three); SQLite still takes its write lock up front (`immediate`), since in WAL mode a
    statement that reads and then writes can fail at once (a busy snapshot) rather than wait for a writer."""
    return immediate(db, serialized=False) if dialect(db) is sqlite else nullcontext(db)


def dialect(db):
    """The dialect module of a connection (a plain `sqlite3.Connection`'s is SQLite's)."""
    return getattr(db, "dialect", sqlite)


def where(db) -> Path | str:
    """The location a connection opened (`:memory:` or "" for a database no other connection can open)."""
    return dialect(db).where(db)


def table_exists(db, name: str) -> bool:
    return dialect(db).table_exists(db, name)


def migrate(db, *, version_table: str, migrations: Sequence[Sequence[str]], what: str) -> None:
    """Apply the migrations after the recorded version, inside the caller's transaction.

    `migrations[i]` holds the statements that take the schema from version i to i + 1, written in SQLite's
    words; each database's dialect renders them in its own.
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
            for rendered in dialect(db).render(statement):
                db.execute(rendered)
    if row is None:
        db.execute(f"INSERT INTO {version_table} (version) VALUES (?)", (len(migrations),))
    elif current < len(migrations):
        db.execute(f"UPDATE {version_table} SET version = ?", (len(migrations),))
