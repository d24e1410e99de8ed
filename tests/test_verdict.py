"""Verdicts: the model, verdict.json, and the records in the broker's state.db."""

from __future__ import annotations

import sqlite3

import pytest

from trainmaster.verify.errors import VerificationError
from trainmaster.verify.records import SCHEMA_VERSION, Database, SecretStore, VerdictStore
from trainmaster.verify.verdict import Verdict, read_verdict


def verdict(outcome="accepted", **kw) -> Verdict:
    return Verdict(outcome=outcome, checks=["integrity", "safety"], job_id="job-1", attempt_id="a1", **kw)


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "home" / "state.db"


def test_exit_codes():
    assert [verdict(o).exit_code for o in ("accepted", "rejected", "cannot_verify")] == [0, 1, 2]
    assert verdict().accepted and not verdict("rejected").accepted


def test_unknown_outcome_is_refused():
    with pytest.raises(ValueError):
        Verdict(outcome="maybe")


def test_verdict_json_round_trip(tmp_path):
    v = verdict("rejected", reasons=["model.pt: pickle"], evidence={"safety": {"files": 3}})
    path = v.write(tmp_path / "job" / "verdict.json")
    assert read_verdict(path) == v
    assert not list(path.parent.glob(".*.tmp"))


def test_store_and_read_back(db_path):
    store = VerdictStore(db_path)
    first = verdict("cannot_verify", reasons=["evaluator crashed"])
    second = verdict("accepted", evidence={"outcome": {"metrics": {"a": 1.0}}})
    store.record(first)
    store.record(second)
    assert store.latest("job-1") == second
    assert store.latest("job-1", "a1") == second
    assert store.latest("job-1", "a2") is None
    assert store.history("job-1") == [first, second]
    assert store.latest("job-2") is None
    store.close()


def test_record_needs_a_job_id(db_path):
    with pytest.raises(ValueError, match="job id"):
        VerdictStore(db_path).record(Verdict(outcome="accepted"))


def test_resolve_job_by_exact_id_or_unique_prefix(db_path):
    store = VerdictStore(db_path)
    for job in ("train-abc123", "train-abd456", "other-1"):
        store.record(verdict(), job_id=job)
    assert store.resolve_job("train-abc123") == "train-abc123"
    assert store.resolve_job("train-abc") == "train-abc123"
    assert store.resolve_job("train-ab") is None  # ambiguous
    assert store.resolve_job("nope") is None


def test_schema_is_versioned_and_wal(db_path):
    VerdictStore(db_path).close()
    VerdictStore(db_path).close()  # idempotent
    db = sqlite3.connect(db_path)
    assert db.execute("SELECT version FROM verify_schema").fetchall() == [(SCHEMA_VERSION,)]
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"verdicts", "commitments", "challenge_secrets", "verify_schema"} <= tables


def test_newer_schema_is_refused(db_path):
    VerdictStore(db_path).close()
    db = sqlite3.connect(db_path)
    db.execute("UPDATE verify_schema SET version = 99")
    db.commit()
    with pytest.raises(VerificationError, match="schema 99") as caught:
        Database(db_path)
    assert caught.value.kind == "cannot_verify"


def test_shares_state_db_with_the_broker(tm_home):
    from trainmaster.broker import paths
    from trainmaster.broker.store import Store

    broker_store = Store(paths.state_db())
    verdicts = VerdictStore(paths.state_db())
    verdicts.record(verdict())
    assert verdicts.latest("job-1").accepted
    broker_store.close()
    verdicts.close()
    Store(paths.state_db()).close()  # the broker's migrations still open the shared file
    assert VerdictStore(paths.state_db()).latest("job-1").accepted


def test_secret_is_stable_and_revealed_only_after_the_verdict(db_path):
    import hashlib

    secrets, verdicts = SecretStore(db_path), VerdictStore(db_path)
    secret = secrets.secret_for("job-1", "a1")
    assert secrets.secret_for("job-1", "a1") == secret
    assert secrets.secret_for("job-1", "a2") != secret  # one per attempt
    assert secrets.digest("job-1", "a1") == hashlib.sha256(secret).hexdigest()
    with pytest.raises(VerificationError, match="only after its verdict"):
        secrets.reveal("job-1", "a1")
    verdicts.record(verdict("rejected"))
    assert secrets.reveal("job-1", "a1") == secret
    with pytest.raises(VerificationError, match="only after its verdict"):
        secrets.reveal("job-1", "a2")
