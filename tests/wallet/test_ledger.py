"""The ledger: append-only movements, idempotency keys, settlement rules, spend reporting (on SQLite and PostgreSQL,
the `database` fixture)."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainmaster.wallet.ledger import (
    MIGRATIONS, AlreadySettled, IdempotencyConflict, Ledger, LedgerError, UnknownReservation,
)

JAN = datetime(2026, 1, 15, tzinfo=timezone.utc).timestamp()
FEB = datetime(2026, 2, 3, tzinfo=timezone.utc).timestamp()


class Clock:
    def __init__(self, at: float = JAN):
        self.at = at

    def __call__(self) -> float:
        return self.at


@pytest.fixture
def ledger(database):
    with Ledger(database, clock=Clock()) as opened:
        yield opened


def reserve(ledger, key, micro_usd, *, job="j1", backend="aws", workload="retraining", project=None, **kw):
    return ledger.reserve(key, job_id=job, backend=backend, workload=workload, project=project, micro_usd=micro_usd, **kw)


def test_reserve_charge_release_lifecycle(ledger):
    r1 = reserve(ledger, "r1", 5_000_000)
    r2 = reserve(ledger, "r2", 7_000_000, job="j2", backend="bittensor", rao=20_000_000_000,
                 rate_micro_usd_per_tao=350_000_000)
    assert {r.key for r in ledger.outstanding()} == {"r1", "r2"}
    charge = ledger.charge("c1", reservation_key="r1", micro_usd=4_200_000, detail={"basis": "3.2 h × $1.31"})
    assert (charge.kind, charge.job_id, charge.backend, charge.micro_usd) == ("charge", "j1", "aws", 4_200_000)
    released = ledger.release("x2", reservation_key="r2")
    assert (released.kind, released.micro_usd, released.rao) == ("release", 0, 0)
    assert ledger.outstanding() == []
    assert [e.kind for e in ledger.entries()] == ["reserve", "reserve", "charge", "release"]
    assert ledger.entries(job_id="j2")[0].rate_micro_usd_per_tao == 350_000_000
    assert ledger.entries(job_id="j1")[1].detail == {"basis": "3.2 h × $1.31"}
    assert r1.kind == r2.kind == "reserve"


def test_retries_with_the_same_key_change_nothing(ledger):
    first = reserve(ledger, "r1", 5_000_000)
    assert reserve(ledger, "r1", 5_000_000) == first
    charge = ledger.charge("c1", reservation_key="r1", micro_usd=4_000_000)
    assert ledger.charge("c1", reservation_key="r1", micro_usd=4_000_000) == charge
    assert len(ledger.entries()) == 2
    assert ledger.spend()[0].micro_usd == 4_000_000


def test_a_reused_key_for_a_different_movement_is_refused(ledger):
    reserve(ledger, "r1", 5_000_000)
    with pytest.raises(IdempotencyConflict, match="differs in micro_usd"):
        reserve(ledger, "r1", 6_000_000)
    with pytest.raises(IdempotencyConflict, match="already used for a reserve"):
        ledger.charge("r1", reservation_key="r1", micro_usd=1)
    assert len(ledger.entries()) == 1


def test_a_reservation_settles_once(ledger):
    reserve(ledger, "r1", 5_000_000)
    ledger.charge("c1", reservation_key="r1", micro_usd=5_000_000)
    with pytest.raises(AlreadySettled, match="already settled by a charge"):
        ledger.charge("c2", reservation_key="r1", micro_usd=5_000_000)
    with pytest.raises(AlreadySettled):
        ledger.release("x1", reservation_key="r1")
    with pytest.raises(UnknownReservation):
        ledger.release("x2", reservation_key="nope")
    with pytest.raises(UnknownReservation):
        ledger.charge("c3", reservation_key="c1", micro_usd=1)  # a charge is not a reservation


def test_the_table_is_append_only(ledger):
    reserve(ledger, "r1", 5_000_000)
    for statement in ("UPDATE ledger_entries SET micro_usd = 0", "DELETE FROM ledger_entries"):
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            ledger.db.execute(statement)
    assert ledger.entries()[0].micro_usd == 5_000_000


@pytest.mark.parametrize("kw, message", [
    ({"micro_usd": -1}, "non-negative integer"),
    ({"micro_usd": 1.5}, "non-negative integer"),
    ({"micro_usd": 1, "rao": 5}, "needs the exchange rate"),
    ({"micro_usd": 1, "rao": 5, "rate_micro_usd_per_tao": 0}, "positive integer"),
])
def test_amounts_are_integers_and_tao_needs_its_rate(ledger, kw, message):
    with pytest.raises(ValueError, match=message):
        ledger.reserve("r", job_id="j", backend="bittensor", workload="retraining", **kw)


def test_spend_groups_charges_only(ledger):
    clock = ledger._clock
    reserve(ledger, "r1", 9_000_000, job="a", backend="aws", workload="retraining", project="p1")
    reserve(ledger, "r2", 9_000_000, job="b", backend="bittensor", workload="initial_training", rao=3,
            rate_micro_usd_per_tao=1)
    reserve(ledger, "r3", 9_000_000, job="c", backend="aws", workload="development")
    ledger.charge("c1", reservation_key="r1", micro_usd=1_000_000)
    clock.at = FEB
    ledger.charge("c2", reservation_key="r2", micro_usd=2_000_000, rao=3, rate_micro_usd_per_tao=1)
    # r3 stays reserved: reserved money is not spend
    assert [(r.group, r.micro_usd, r.rao, r.charges) for r in ledger.spend()] == [("total", 3_000_000, 3, 2)]
    assert [(r.group, r.micro_usd) for r in ledger.spend("backend")] == [("bittensor", 2_000_000), ("aws", 1_000_000)]
    assert [r.group for r in ledger.spend("class")] == ["initial_training", "retraining"]
    assert [r.group for r in ledger.spend("job")] == ["b", "a"]
    assert [r.group for r in ledger.spend("project")] == ["-", "p1"]
    assert [(r.group, r.micro_usd) for r in ledger.spend("month")] == [("2026-01", 1_000_000), ("2026-02", 2_000_000)]
    assert [r.micro_usd for r in ledger.spend(since=FEB)] == [2_000_000]
    with pytest.raises(ValueError, match="cannot group spend by 'region'"):
        ledger.spend("region")


def test_empty_ledger_spends_nothing(ledger):
    assert [(r.group, r.micro_usd) for r in ledger.spend()] == [("total", 0)]
    assert ledger.spend("backend") == []


def test_restart_keeps_everything_and_replays(database):
    with Ledger(database) as first:
        reserve(first, "r1", 5_000_000)
    with Ledger(database) as second:
        assert reserve(second, "r1", 5_000_000).seq == 1
        assert len(second.entries()) == 1
        if second.db.dialect.NAME == "sqlite":
            assert second.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert second.db.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000
        assert [tuple(r) for r in second.db.execute("SELECT version FROM ledger_schema")] == [(len(MIGRATIONS),)]


def test_lives_beside_the_broker_store_on_its_connection(database):
    from trainmaster.broker.store import Store
    from trainmaster.storage import statedb

    store = Store(database)
    ledger = Ledger(store.db)
    reserve(ledger, "r1", 5_000_000)
    assert all(statedb.table_exists(store.db, t) for t in ("jobs", "schema_version", "ledger_entries", "ledger_schema"))
    ledger.close()  # does not close the store's connection
    assert store.db.execute("SELECT COUNT(*) FROM ledger_entries").fetchone()[0] == 1
    store.close()


def test_a_version_1_ledger_upgrades_without_resending_its_old_alerts(tmp_path):
    from trainmaster.storage import statedb
    from trainmaster.wallet import outbox

    db = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    with statedb.immediate(db):
        statedb.migrate(db, version_table="ledger_schema", migrations=MIGRATIONS[:1], what="the ledger")
    db.execute("INSERT INTO ledger_alerts VALUES ('b', 0, 80, 9000000, 1.0)")  # fired (and posted) by version 1
    ledger = Ledger(db)
    assert db.execute("SELECT version FROM ledger_schema").fetchall() == [(len(MIGRATIONS),)]
    assert db.execute("SELECT budget, webhook, delivered_at, tries FROM ledger_alerts").fetchall() == [("b", None, None, 0)]
    assert not outbox.has_pending(db) and ledger.deliveries == []


def test_refuses_a_newer_schema_and_a_busy_connection(tmp_path):
    db = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    Ledger(db)
    db.execute("UPDATE ledger_schema SET version = 99")
    with pytest.raises(LedgerError, match="schema version 99, newer"):
        Ledger(db)
    db.execute("UPDATE ledger_schema SET version = 1")
    db.execute("BEGIN")
    with pytest.raises(LedgerError, match="inside another transaction"):
        Ledger(db)


# A random run of movements, every call possibly retried: the ledger ends as if each ran once.
MOVES = st.lists(st.tuples(st.sampled_from(["reserve", "charge", "release"]), st.integers(0, 5),
                           st.integers(0, 10_000_000), st.booleans()), max_size=30)


@settings(max_examples=80, deadline=None)
@given(MOVES)
def test_retried_calls_leave_the_ledger_as_if_each_ran_once(moves):
    once, twice = Ledger(":memory:"), Ledger(":memory:")
    for kind, n, amount, retry in moves:
        for target in (once, twice):
            calls = 2 if (retry and target is twice) else 1
            outcomes = set()
            for _ in range(calls):
                outcomes.add(_apply(target, kind, n, amount))
            assert len(outcomes) == 1  # a retry answers exactly as the first call did
    strip = lambda ledger: [(e.key, e.kind, e.reservation_key, e.micro_usd) for e in ledger.entries()]  # noqa: E731
    assert strip(once) == strip(twice)
    assert once.spend("job") == twice.spend("job")


def _apply(ledger: Ledger, kind: str, n: int, amount: int) -> str:
    """One movement; its result (or error class) as a comparable string."""
    try:
        if kind == "reserve":
            entry = ledger.reserve(f"r{n}", job_id=f"j{n}", backend="aws", workload="retraining", micro_usd=amount)
        elif kind == "charge":
            entry = ledger.charge(f"c{n}", reservation_key=f"r{n}", micro_usd=amount)
        else:
            entry = ledger.release(f"x{n}", reservation_key=f"r{n}")
    except LedgerError as exc:
        return type(exc).__name__
    return f"{entry.seq}:{entry.key}:{entry.micro_usd}"
