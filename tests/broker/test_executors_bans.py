"""Executor bans and reputation on SQLite and PostgreSQL (the `database` fixture): a ban holds once until it is
lifted, a lifted key can be banned again, and each hotkey's ended attempts are counted by how they ended."""

from __future__ import annotations

from trainmaster.broker.executors import Executors
from trainmaster.broker.store import Store


def test_ban_lift_and_ban_again(database):
    store = Store(database)
    executors = Executors(store.db)
    assert executors.ban("hotkey", "5Hot", reason="rejected", by="verdict", job_id="j", attempt_id="j.1")
    assert not executors.ban("hotkey", "5Hot", reason="again", by="user")  # the first ban's reason stands
    assert [(b.key, b.reason, b.by) for b in executors.bans()] == [("5Hot", "rejected", "verdict")]
    assert [b.key for b in executors.lift("5Hot")] == ["5Hot"] and executors.bans() == []
    assert executors.ban("hotkey", "5Hot", reason="cheated", by="user")
    assert [(b.reason, b.by, b.job_id, b.active) for b in executors.bans(include_lifted=True)] == [
        ("cheated", "user", None, True)]
    assert executors.banned() == (frozenset({"5Hot"}), frozenset())
    store.close()


def test_records_count_each_hotkeys_ended_attempts(database):
    store = Store(database)
    for n, end in enumerate(["failed", "rejected", "failed"]):
        job_id = f"j-{n}"
        store.create_job(job_id=job_id, name="j", workload="development", project=None, spec_json="{}",
                         spec_path="/x/job.yaml", bundle_sha256="0" * 64, policy="default", policy_json="{}")
        store.move_job(job_id, "planned")
        attempt = store.create_attempt(job_id, backend="bittensor", offer_json="{}", reserve_key=f"r{n}", seed=n)
        store.set_executor(attempt.id, hotkey="5Hot", coldkey="5Cold")
        store.move_attempt(attempt.id, end)
    [record] = Executors(store.db).records()
    assert (record.hotkey, record.coldkey, record.accepted, record.rejected, record.failed) == (
        "5Hot", "5Cold", 0, 1, 2)
    store.close()
