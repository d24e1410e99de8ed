"""The state store: WAL (SQLite), versioned schema, the state machine enforced, moves idempotent and race-free, on
SQLite and PostgreSQL (the `database` fixture)."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from trainmaster.broker.states import IllegalTransition
from trainmaster.broker.store import MIGRATIONS, NotFound, Store


def new_job(store: Store, job_id: str = "j-1"):
    return store.create_job(job_id=job_id, name="j", workload="development", project=None, spec_json="{}",
                            spec_path="/x/job.yaml", bundle_sha256="0" * 64, policy="default",
                            policy_json="{}")


def test_wal_mode_and_schema_version(tmp_path):
    store = Store(tmp_path / "state.db")
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.schema_version == len(MIGRATIONS)
    store.close()
    assert Store(tmp_path / "state.db").schema_version == len(MIGRATIONS)  # reopening migrates nothing twice


def test_newer_schema_is_refused(database):
    from trainmaster.storage import statedb

    Store(database).close()
    db = statedb.connect(database)
    db.execute("UPDATE schema_version SET version = 99")
    db.close()
    with pytest.raises(RuntimeError, match="newer than this trainmaster knows"):
        Store(database)


def test_illegal_transition_is_refused_and_recorded_nowhere(database):
    store = Store(database)
    new_job(store)
    before = len(store.events("j-1"))
    with pytest.raises(IllegalTransition, match="cannot go from submitted to accepted"):
        store.move_job("j-1", "accepted")
    assert store.job("j-1").state == "submitted"
    assert len(store.events("j-1")) == before


def test_moves_are_idempotent(database):
    store = Store(database)
    new_job(store)
    assert store.move_job("j-1", "planned") is True
    assert store.move_job("j-1", "planned") is False
    assert [e.to_state for e in store.events("j-1")] == ["submitted", "planned"]


def test_attempt_and_job_move_together(database):
    store = Store(database)
    new_job(store)
    store.move_job("j-1", "planned")
    attempt = store.create_attempt("j-1", backend="local", offer_json="{}", reserve_key="reserve:j-1.1.p1", seed=0)
    assert (attempt.id, attempt.state, store.job("j-1").state) == ("j-1.1", "dispatched", "dispatched")
    store.move_attempt(attempt.id, "running", job_target="running", started_at=5.0)
    assert store.attempt(attempt.id).started_at == 5.0 and store.job("j-1").state == "running"
    # an illegal job move rolls back the attempt move made in the same transaction
    with pytest.raises(IllegalTransition):
        store.move_attempt(attempt.id, "returned", job_target="accepted")
    assert store.attempt(attempt.id).state == "running"


def test_cost_is_recorded_once(database):
    store = Store(database)
    new_job(store)
    store.move_job("j-1", "planned")
    a = store.create_attempt("j-1", backend="local", offer_json="{}", reserve_key="reserve:j-1.1.p1", seed=0)
    store.record_cost(a.id, micro_usd=10, rao=0, billable_seconds=1.0, basis="t")
    store.record_cost(a.id, micro_usd=99, rao=0, billable_seconds=9.0, basis="t")
    assert store.attempt(a.id).cost_micro_usd == 10
    assert sum(1 for e in store.events("j-1") if e.kind == "cost") == 1


def test_find_job_by_prefix(database):
    store = Store(database)
    new_job(store, "abc-1")
    new_job(store, "abc-2")
    assert store.find_job("abc-1").id == "abc-1"
    with pytest.raises(NotFound, match="several"):
        store.find_job("abc")
    with pytest.raises(NotFound):
        store.find_job("zzz")


def _race(path, barrier, results):
    store = Store(path)
    barrier.wait()
    results.put(store.move_job("j-1", "planned"))


def test_two_processes_racing_one_move_one_wins(database):
    path = database
    new_job(Store(path))
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(path, barrier, results)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    wins = sorted(results.get(timeout=5) for _ in procs)
    assert wins == [False, False, False, True]
    assert [e.to_state for e in Store(path).events("j-1")].count("planned") == 1


def test_a_database_of_the_first_schema_upgrades_in_place_and_its_jobs_still_read(tmp_path):
    """A state.db written by the previous version (schema 1: no plan, policy snapshot, seeds) is migrated."""
    from trainmaster.broker.store import MIGRATIONS
    from trainmaster.storage import statedb

    path = tmp_path / "state.db"
    db = statedb.connect(path)
    with statedb.immediate(db):
        statedb.migrate(db, version_table="schema_version", migrations=MIGRATIONS[:1], what="v1")
        db.execute("INSERT INTO jobs VALUES ('old-1','old','development',NULL,'planned','{}','/x/job.yaml',?,"
                   "'default',NULL,0,0)", ("0" * 64,))
    db.close()
    store = Store(path)
    assert store.schema_version == len(MIGRATIONS) == 6
    job = store.job("old-1")
    assert (job.state, job.policy_json, job.plan_json, job.queued_at, job.cancel_requested_at) == (
        "planned", None, None, None, None)  # re-planned and snapshotted on advance


def test_big_integers_and_outputs_round_trip(database):
    """Seeds and money overflow a 32-bit INTEGER (BIGINT on PostgreSQL); re-recorded outputs replace their row."""
    store = Store(database)
    new_job(store)
    store.move_job("j-1", "planned")
    attempt = store.create_attempt("j-1", backend="local", offer_json="{}", reserve_key="r", seed=2**62 + 1)
    store.record_cost(attempt.id, micro_usd=2**40, rao=2**50, billable_seconds=1.5, basis="test",
                      rate_micro_usd_per_tao=7)
    store.record_outputs(attempt.id, [("model.pt", 1, "a" * 64)])
    store.record_outputs(attempt.id, [("model.pt", 2, "b" * 64), ("log.txt", 3, "c" * 64)])
    got = store.attempt(attempt.id)
    assert (got.seed, got.cost_micro_usd, got.cost_rao, got.billable_seconds) == (2**62 + 1, 2**40, 2**50, 1.5)
    assert store.outputs(attempt.id) == [("log.txt", 3, "c" * 64), ("model.pt", 2, "b" * 64)]
