"""A PostgreSQL connection the server drops comes back on its next use (storage/dialects/postgresql.py), and only
where that is safe does the statement that met the break run again: a read or a BEGIN outside a transaction; a
write, or any statement of a transaction the break cut, fails (the caller's step is done again, whole)."""

from __future__ import annotations

import psycopg
import pytest

from trainmaster.storage import statedb


def _end_session(url: str, db) -> None:
    """`pg_terminate_backend` on the connection's server process, from another session."""
    pid = db.execute("SELECT pg_backend_pid()").fetchone()[0]
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_a_read_after_the_session_was_ended_is_answered_on_a_new_one(postgres_url):
    db = statedb.connect(postgres_url)
    try:
        first = db.execute("SELECT pg_backend_pid()").fetchone()[0]
        _end_session(postgres_url, db)
        assert db.execute("SELECT 41 + 1").fetchone()[0] == 42
        assert db.execute("SELECT pg_backend_pid()").fetchone()[0] != first and db.reconnects == 1
    finally:
        db.close()


def test_a_write_that_met_the_break_fails_once_and_the_next_one_works(postgres_url):
    db = statedb.connect(postgres_url)
    try:
        db.execute("CREATE TABLE t (n INTEGER)")
        _end_session(postgres_url, db)
        with pytest.raises(statedb.OperationalError):
            db.execute("INSERT INTO t (n) VALUES (?)", (1,))  # its outcome is the caller's to find out
        db.execute("INSERT INTO t (n) VALUES (?)", (2,))
        assert [r[0] for r in db.execute("SELECT n FROM t").fetchall()] == [2]
    finally:
        db.close()


def test_a_transaction_cut_by_the_break_fails_whole_and_the_next_one_runs(postgres_url):
    db = statedb.connect(postgres_url)
    try:
        db.execute("CREATE TABLE t (n INTEGER)")
        with pytest.raises(statedb.OperationalError):
            with statedb.immediate(db) as tx:
                tx.execute("INSERT INTO t (n) VALUES (?)", (1,))
                _end_session(postgres_url, db)
                tx.execute("INSERT INTO t (n) VALUES (?)", (2,))  # never on a new session, outside the transaction
        assert not db.in_transaction
        with statedb.immediate(db) as tx:
            tx.execute("INSERT INTO t (n) VALUES (?)", (3,))
        assert [r[0] for r in db.execute("SELECT n FROM t").fetchall()] == [3]  # nothing of the cut one
    finally:
        db.close()


def test_a_server_still_away_is_an_operational_error_at_once(tmp_path):
    from postgres_server import _free_port

    with pytest.raises(statedb.OperationalError):
        statedb.connect(f"postgresql://tm@127.0.0.1:{_free_port()}/nothing")
