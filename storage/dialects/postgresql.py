"""PostgreSQL: a team server that several daemons and users share (psycopg 3, the `postgres` extra, imported
only when a `postgresql://` location is opened).

The connection takes the same SQL as SQLite's: `?` placeholders become psycopg's, integer sums come back as
`int`, rows answer by name and by index, and the driver's errors are raised as the storage layer's (those of
`sqlite3`, the DB-API names every caller already catches). A serialized write transaction (the default of
`statedb.immediate`) takes a transaction-scoped advisory lock first, so it has SQLite's one-writer semantics
across processes and hosts: a check and the write that depends on it stay atomic. One that is not (the
ledger's movements, the leases) locks the rows and names it depends on instead (`FOR_UPDATE`, `lock_key`). Migrations, written in SQLite's words, are rendered: integers are
BIGINT (micro-USD and seeds overflow INTEGER), REAL is DOUBLE PRECISION, BLOB is BYTEA, AUTOINCREMENT is an
identity column, and a `RAISE(ABORT)` trigger becomes a PL/pgSQL function and its trigger.
"""

from __future__ import annotations

import asyncio
import functools
import re
import sqlite3
import sys
import threading
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

NAME = "postgresql"

NOW = "(extract(epoch from clock_timestamp())::double precision)"
"""The database's clock in Unix seconds (the statement's own time, not the transaction's start)."""

WRITER_LOCK = 0x7472_6D73
"""The advisory lock (a bigint key) every serialized write transaction takes: one writer at a time, as SQLite."""


class Row(tuple):
    """A row by index (`row[0]`, `tuple(row)`) and by name (`row["id"]`, `dict(row)`, `Job(**row)`)."""

    names: dict[str, int]

    def __getitem__(self, key):
        return super().__getitem__(self.names[key] if isinstance(key, str) else key)

    def keys(self) -> list[str]:
        return list(self.names)


def _row_factory(cursor):
    """The row class of a result's columns (read off the result itself: cheaper than `cursor.description`)."""
    result = cursor.pgresult
    fields = result.nfields if result is not None else 0
    return _row_class(tuple(result.fname(i).decode() for i in range(fields)))


@functools.lru_cache(maxsize=1024)
def _row_class(names: tuple[str, ...]) -> type[Row]:
    return type("Row", (Row,), {"names": {name: i for i, name in enumerate(names)}})


class Connection:
    """An autocommit psycopg connection (transactions are explicit) speaking the SQL of SQLite's interface.

    A connection the server dropped (a restart, `pg_terminate_backend`, a network cut) is opened again on its next
    use, so a long-lived holder (the daemon's store, ledger, leases) comes back with the server. The statement
    that met the break is retried on the new session only when that is safe: a read or a `BEGIN` outside a
    transaction. A write's outcome is unknown (it may have committed), and a transaction's earlier statements
    died with the session, so those raise `OperationalError`, and so does every statement of that transaction
    until its `ROLLBACK` (the caller's `statedb.immediate` sends it): the caller's pass fails and is done again,
    whole. A server still away raises `OperationalError` at once (`connect_timeout` bounds an unanswered connect)."""

    def __init__(self, url: str):
        self.location = url
        self.reconnects = 0
        """How many times the session was opened again after the server dropped it."""
        self._tx_open = False
        self._closed = False
        self._db = _open(url)

    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        if self._db.closed:
            return self._tx_open
        return self._tx_open or self._db.info.transaction_status != TransactionStatus.IDLE

    def execute(self, sql: str, params: Sequence[Any] = ()):
        """Run `sql` with its `?` parameters; without any, as written (several statements may then be sent at once)."""
        word = sql.lstrip()[:8].upper()
        if word.startswith(("ROLLBACK", "COMMIT")) and self._db.closed and not self._closed:
            self._tx_open = False  # the session died: its transaction went with it, there is nothing to end
            if word.startswith("COMMIT"):
                raise sqlite3.OperationalError("the connection to the database was lost before the commit")
            return None
        cursor = self._run(lambda cursor: cursor.execute(_sql(sql), params) if params else cursor.execute(sql),
                           retry=word.startswith(("SELECT", "BEGIN")))
        if word.startswith("BEGIN"):
            self._tx_open = True
        elif word.startswith(("ROLLBACK", "COMMIT")):
            self._tx_open = False
        return cursor

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]):
        return self._run(lambda cursor: cursor.executemany(_sql(sql), list(rows)), retry=False)

    def _run(self, call, *, retry: bool):
        import psycopg

        retry = retry and not self._tx_open
        cursor = self._session().cursor()
        try:
            call(cursor)
        except psycopg.Error as exc:
            if not (retry and self._db.closed and not self._closed):
                raise _translated(exc) from exc
            cursor = self._session().cursor()  # the session had died: once more on a new one (a read, or BEGIN)
            try:
                call(cursor)
            except psycopg.Error as again:
                raise _translated(again) from again
        return cursor

    def _session(self):
        """The live session: opened again when the server dropped it (never inside a transaction)."""
        if not self._db.closed or self._closed:
            return self._db
        if self._tx_open:
            raise sqlite3.OperationalError("the connection to the database was lost inside a transaction; "
                                           "the transaction is rolled back")
        self._db = _open(self.location)
        self.reconnects += 1
        return self._db

    def close(self) -> None:
        self._closed = True
        self._db.close()


CONNECT_TIMEOUT_S = 10
"""How long opening a session may wait for an unanswered server (a refused one fails at once)."""


def _open(url: str):
    """A new autocommit session on the server at `url`; its error as the storage layer's."""
    import psycopg

    try:
        db = psycopg.connect(url, autocommit=True, row_factory=_row_factory, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.Error as exc:
        raise _translated(exc) from None
    db.adapters.register_loader("numeric", _numeric_loader())
    return db


Connection.dialect = sys.modules[__name__]


def connect(url: str) -> Connection:
    return Connection(url)


KEY_LOCKS = 1
"""The namespace of `lock_key`'s advisory locks (the first of two int4 keys; a space apart from bigint keys)."""

FOR_UPDATE = " FOR UPDATE"
"""The suffix that locks the rows a SELECT reads until the transaction ends."""


def begin(db: Connection, *, serialized: bool) -> None:
    """A write transaction; `serialized`: one at a time (the advisory lock), as SQLite's BEGIN IMMEDIATE."""
    db.execute(f"BEGIN; SELECT pg_advisory_xact_lock({WRITER_LOCK})" if serialized else "BEGIN")  # one round trip


def lock_key(db: Connection, key: str) -> None:
    """Lock a name until the transaction ends (transactions locking the same name run one after the other)."""
    db.execute(f"SELECT pg_advisory_xact_lock({KEY_LOCKS}, hashtext(?))", (key,))


def where(db: Connection) -> str:
    return db.location


def table_exists(db: Connection, name: str) -> bool:
    return db.execute("SELECT to_regclass(?)", (name,)).fetchone()[0] is not None


def month(column: str) -> str:
    """The `YYYY-MM` (UTC) of a Unix-seconds column."""
    return f"to_char(to_timestamp({column}) AT TIME ZONE 'UTC', 'YYYY-MM')"


def json_text(column: str, *keys: str) -> str:
    """The value at `keys` in a JSON text column, as text."""
    return f"({column}::jsonb #>> '{{{','.join(keys)}}}')"


_TYPES = [
    (re.compile(r"\bINTEGER PRIMARY KEY AUTOINCREMENT\b"), "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    (re.compile(r"\bBLOB\b"), "BYTEA"),
]
_ABORT_TRIGGER = re.compile(
    r"CREATE TRIGGER (?P<name>\w+) BEFORE (?P<event>UPDATE|DELETE|INSERT) ON (?P<table>\w+)"
    r"(?: WHEN (?P<when>.+?))?\s+BEGIN SELECT RAISE\(ABORT, '(?P<message>[^']*)'\); END",
    re.DOTALL,
)


def render(statement: str) -> list[str]:
    """A migration statement written for SQLite, in PostgreSQL's words."""
    trigger = _ABORT_TRIGGER.fullmatch(statement.strip())
    if trigger is not None:
        name, when = trigger["name"], f" WHEN ({trigger['when']})" if trigger["when"] else ""
        return [
            f"CREATE FUNCTION {name}_abort() RETURNS trigger LANGUAGE plpgsql AS"
            f" $$ BEGIN RAISE EXCEPTION '{trigger['message']}'; END $$",
            f"CREATE TRIGGER {name} BEFORE {trigger['event']} ON {trigger['table']} FOR EACH ROW{when}"
            f" EXECUTE FUNCTION {name}_abort()",
        ]
    for pattern, replacement in _TYPES:
        statement = pattern.sub(replacement, statement)
    return [statement]


@functools.lru_cache(maxsize=1024)
def _sql(sql: str) -> str:
    """`?` placeholders (outside quoted strings) as psycopg's `%s`; a literal `%` doubled."""
    out, quote = [], None
    for char in sql:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "?":
            out.append("%s")
            continue
        out.append("%%" if char == "%" else char)
    return "".join(out)


@functools.cache
def _numeric_loader():
    """NUMERIC (what SUM of a BIGINT gives) as `int` when it is whole: money stays in integers. One class for the
    process: psycopg keeps every loader class it is given, so a class made per connection stayed for good (a
    daemon kept about five per job it ran)."""
    from decimal import Decimal

    from psycopg.types.numeric import NumericLoader

    class WholeNumericLoader(NumericLoader):
        def load(self, data) -> Any:
            value: Decimal = super().load(data)
            return int(value) if value == value.to_integral_value() else value

    return WholeNumericLoader


def _translated(exc: Exception) -> sqlite3.Error:
    """The driver's error as the storage layer's: integrity, operational (a missing table too) or other."""
    import psycopg

    if isinstance(exc, psycopg.IntegrityError) or getattr(exc, "sqlstate", None) == "P0001":
        kind = sqlite3.IntegrityError  # a constraint, or a trigger refusing the change (RAISE EXCEPTION)
    elif isinstance(exc, (psycopg.OperationalError, psycopg.ProgrammingError)):
        kind = sqlite3.OperationalError
    else:
        kind = sqlite3.DatabaseError
    return kind(f"{exc}")


SESSION_LOCKS = 2
"""The advisory-lock namespace of `SessionLocks`."""


class SessionLocks:
    """Locks on names across processes and hosts, held on sessions of the server at `url` (one per holder
    while it holds a lock, so coroutines take turns too); a holder that dies releases its lock with its
    session. A released lock's session is kept, up to `kept`, for the next lock: opening one starts a
    server process, the dearest step of advancing a job. `close()` ends the kept sessions."""

    def __init__(self, url: str, *, kept: int = 4):
        self.url, self.kept = url, kept
        self._idle: list[Connection] = []
        self._guard = threading.Lock()

    @asynccontextmanager
    async def hold(self, name: str, *, poll_s: float = 0.02) -> AsyncIterator[None]:
        """Hold the lock on `name` until the block ends. Polled without blocking, so an event loop keeps
        running while it waits. A session whose unlock did not complete is closed, which releases it."""
        db = await asyncio.to_thread(self._session)
        unlocked = False
        try:
            take = f"SELECT pg_try_advisory_lock({SESSION_LOCKS}, hashtext(?))"
            while not (await asyncio.to_thread(lambda: db.execute(take, (name,)).fetchone()[0])):
                await asyncio.sleep(poll_s)
            try:
                yield
            finally:
                unlocked = await asyncio.to_thread(_unlock, db, name)
        finally:
            if not (unlocked and self._keep(db)):
                await asyncio.to_thread(db.close)  # ends the session: its lock goes with it

    def close(self) -> None:
        with self._guard:
            idle, self._idle = self._idle, []
        for db in idle:
            db.close()

    def _session(self) -> Connection:
        with self._guard:
            if self._idle:
                return self._idle.pop()
        return Connection(self.url)

    def _keep(self, db: Connection) -> bool:
        with self._guard:
            if len(self._idle) >= self.kept:
                return False
            self._idle.append(db)
            return True


def _unlock(db: Connection, name: str) -> bool:
    """Release a session lock; False when the session failed (it is then closed, not kept)."""
    try:
        return bool(db.execute(f"SELECT pg_advisory_unlock({SESSION_LOCKS}, hashtext(?))", (name,)).fetchone()[0])
    except sqlite3.Error:
        return False
