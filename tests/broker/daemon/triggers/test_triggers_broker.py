"""The trigger engine on the real broker: a data threshold submits a tiny local job, which runs to accepted and
makes the cursor the baseline; a submit is idempotent on its key; the budget the broker checks before dispatch
holds a fire back."""

from __future__ import annotations

import asyncio

import pytest

from trainmaster.broker import paths
from trainmaster.broker.daemon.triggers.engine import TriggerEngine
from trainmaster.broker.daemon.triggers.model import Data, Trigger
from trainmaster.broker.daemon.triggers.records import Records
from trainmaster.broker.daemon.triggers.submitting import broker_gate, broker_submit
from trainmaster.broker.service import Broker

WRITE_OUTPUT = """
    import os, pathlib
    pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"], "result.txt").write_bytes(b"w" * 1000)
    print("trained")
"""
NOW = 1_700_000_000.0


@pytest.fixture
def real_broker(tm_home, database):
    """A broker on SQLite, then on PostgreSQL (the `database` fixture): fires, baselines and cursors live there."""
    broker = Broker()
    yield broker
    broker.close()


@pytest.mark.slow
def test_the_threshold_submits_a_local_job_whose_acceptance_makes_the_baseline(real_broker, job_factory, tmp_path):
    folder = tmp_path / "experiences"
    folder.mkdir()
    (folder / "a.jsonl").write_text("{}\n")
    spec = job_factory(WRITE_OUTPUT, name="agent")
    nightly = Trigger(name="agent", spec=spec, data=Data(folder=folder, min_new=2))
    eng = TriggerEngine(paths.state_db(), [nightly], broker_submit(real_broker), gate=broker_gate(real_broker))

    async def scenario():
        assert await eng.tick(NOW) == []
        (folder / "b.jsonl").write_text("{}\n")
        [fired] = await eng.tick(NOW + 1)
        assert await eng.tick(NOW + 2) == []  # its job has not ended
        job = await real_broker.wait(fired.job_id, timeout_s=60)
        assert await eng.tick(NOW + 3) == []  # accepted: the two files are the baseline now
        return fired, job

    fired, job = asyncio.run(scenario())
    assert job.state == "accepted" and job.name == "agent"
    assert real_broker.store.events(job.id)[0].detail["origin"] == {"trigger_key": fired.key, "reason": fired.reason}
    records = Records(paths.state_db())
    assert records.baseline("agent")[1] == {"names": ["a.jsonl", "b.jsonl"]}
    records.close()
    eng.close()


def test_a_submit_with_a_key_already_used_returns_the_same_job(real_broker, job_factory):
    submit = broker_submit(real_broker)
    spec = job_factory("print('x')\n")

    async def twice():
        return [await submit(spec, "default", "trigger t: manual", "t:0:abc") for _ in range(2)]

    first, second = asyncio.run(twice())
    assert first == second and [j.id for j in real_broker.store.jobs()] == [first]


def test_the_brokers_budget_check_holds_the_fire_back(real_broker, job_factory, tmp_path):
    spec = job_factory(WRITE_OUTPUT, "limits:\n  max_hours: 10\n")  # 10 h × the local price is over $0.01
    policy = tmp_path / "tight.yaml"
    policy.write_text("name: tight\ndefault:\n  primary: local\nbudgets:\n  - name: tiny\n    period: total\n"
                      "    cap: 0.01\n")
    eng = TriggerEngine(paths.state_db(), [Trigger(name="t", spec=spec, policy=str(policy), schedule="* * * * *")],
                        broker_submit(real_broker), gate=broker_gate(real_broker))
    asyncio.run(eng.tick(NOW))
    assert asyncio.run(eng.tick(NOW + 60)) == []
    assert "refused by budget" in eng.problems["t"] and "tiny" in eng.problems["t"]
    assert real_broker.store.jobs() == []


def test_a_spec_that_cannot_be_planned_holds_the_fire_back(real_broker, tmp_path):
    eng = TriggerEngine(paths.state_db(), [Trigger(name="t", spec=tmp_path / "missing.yaml", schedule="* * * * *")],
                        broker_submit(real_broker), gate=broker_gate(real_broker))
    asyncio.run(eng.tick(NOW))
    assert asyncio.run(eng.tick(NOW + 60)) == []
    assert eng.problems["t"].startswith("cannot be submitted now:") and "no such file" in eng.problems["t"]
