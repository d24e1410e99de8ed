"""The trigger engine's decisions with a fake clock: a simulated week of a nightly schedule and a data threshold,
debounce, one run at a time, the budget gate, manual fires, baselines that move only on acceptance, and a crash
between recording a fire and submitting it (neither lost nor doubled)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

import pytest

from trainmaster.broker.daemon.triggers.engine import TriggerEngine, TriggerRefused
from trainmaster.broker.daemon.triggers.model import Data
from trigger_support import Crash, Jobs, trigger

MONDAY = datetime(2024, 1, 1, tzinfo=timezone.utc).timestamp()
HOUR = 3600.0


@pytest.fixture
def db(tmp_path):
    return tmp_path / "state.db"


@pytest.fixture
def jobs(db):
    return Jobs(db)


def engine(db, jobs, triggers, **kw) -> TriggerEngine:
    return TriggerEngine(db, triggers, jobs.submit, clock=lambda: MONDAY, **kw)


def tick(eng, now):
    return asyncio.run(eng.tick(now))


def add_files(folder, n, start=0):
    folder.mkdir(exist_ok=True)
    for i in range(start, start + n):
        (folder / f"part-{i:05d}.jsonl").write_text("{}\n")


@pytest.mark.slow
def test_a_simulated_week_fires_nightly_at_one_and_once_per_five_new_files(db, jobs, tmp_path):
    folder = tmp_path / "incoming"
    folder.mkdir()
    nightly = trigger("nightly", schedule="0 1 * * *")
    data = trigger("data", data=Data(folder=folder, min_new=5))
    eng = engine(db, jobs, [nightly, data])
    fires: list[tuple[float, object]] = []
    submitted_at: dict[str, float] = {}
    files = 0
    for step in range(7 * 24 * 6):  # every 10 minutes for a week
        now = MONDAY + step * 600
        if step and step % 12 == 0:  # a file every 2 hours
            add_files(folder, 1, files)
            files += 1
        for job_id in jobs.all():  # the runner: a job is accepted 30 minutes after its submit
            job = jobs.store.job(job_id)
            if job.state == "submitted" and now - submitted_at[job_id] >= 1800:
                jobs.end(job_id)
        fired = tick(eng, now)
        submitted_at.update({f.job_id: now for f in fired})
        fires += [(now, f) for f in fired]
    nightly_fires = [(now, f) for now, f in fires if f.trigger == "nightly"]
    assert [datetime.fromtimestamp(now, timezone.utc).strftime("%a %H:%M") for now, _ in nightly_fires] == [
        "Mon 01:00", "Tue 01:00", "Wed 01:00", "Thu 01:00", "Fri 01:00", "Sat 01:00", "Sun 01:00"]
    data_fires = [f for _, f in fires if f.trigger == "data"]
    assert files == 83 and len(data_fires) == 83 // 5
    assert all("data: 5 new since the last accepted run" in f.reason for f in data_fires)
    assert len({f.key for _, f in fires}) == len(fires) == len(jobs.all())
    eng.close()


def test_missed_slots_fire_once_and_a_new_trigger_does_not_fire_for_the_past(db, jobs):
    eng = engine(db, jobs, [trigger(schedule="0 1 * * *")])
    assert tick(eng, MONDAY + 5 * HOUR) == []  # first seen after Monday's slot: not due
    [fired] = tick(eng, MONDAY + 3 * 24 * HOUR + 5 * HOUR)  # down since: Tue, Wed, Thu slots missed
    assert "2024-01-04 01:00 UTC" in fired.reason
    jobs.end(fired.job_id)
    assert tick(eng, MONDAY + 3 * 24 * HOUR + 6 * HOUR) == []


def test_the_schedule_is_read_in_its_time_zone(db, jobs):
    eng = engine(db, jobs, [trigger(schedule="0 1 * * *", timezone="America/New_York")])
    tick(eng, MONDAY)
    assert tick(eng, MONDAY + 2 * HOUR) == []  # 01:00 UTC is not 01:00 in New York
    [fired] = tick(eng, MONDAY + 6 * HOUR)  # 06:00 UTC = 01:00 EST
    assert "2024-01-01 01:00 America/New_York" in fired.reason


def test_debounce_keeps_fires_apart(db, jobs, tmp_path):
    folder = tmp_path / "d"
    add_files(folder, 1)
    eng = engine(db, jobs, [trigger(data=Data(folder=folder, min_new=1), debounce_s=HOUR)])
    [first] = tick(eng, MONDAY)
    jobs.end(first.job_id)
    add_files(folder, 1, 1)
    assert tick(eng, MONDAY + 600) == [] and tick(eng, MONDAY + HOUR - 1) == []
    [second] = tick(eng, MONDAY + HOUR)
    assert second.key != first.key


def test_one_run_at_a_time(db, jobs):
    eng = engine(db, jobs, [trigger(schedule="* * * * *")])
    tick(eng, MONDAY)
    [first] = tick(eng, MONDAY + 60)
    for minute in range(2, 10):  # its job runs on: the slots pass without a fire
        assert tick(eng, MONDAY + minute * 60) == []
    jobs.end(first.job_id, "failed")
    [second] = tick(eng, MONDAY + 10 * 60 + 5)  # ended (failed): the missed slots fire once
    assert "00:10" in second.reason and len(jobs.all()) == 2


def test_a_failed_run_leaves_its_data_counted_and_an_accepted_one_makes_the_baseline(db, jobs, tmp_path):
    folder = tmp_path / "d"
    add_files(folder, 3)
    eng = engine(db, jobs, [trigger(data=Data(folder=folder, min_new=3))])
    [first] = tick(eng, MONDAY)
    jobs.end(first.job_id, "failed")
    [again] = tick(eng, MONDAY + 10)  # the same three files count again
    assert again.key != first.key and again.job_id != first.job_id
    jobs.end(again.job_id)
    assert tick(eng, MONDAY + 20) == []  # accepted: they are the baseline now
    add_files(folder, 2, 3)
    assert tick(eng, MONDAY + 30) == []
    add_files(folder, 1, 5)
    [third] = tick(eng, MONDAY + 40)
    assert "3 new" in third.reason


def test_the_budget_gate_holds_a_fire_back_and_says_why(db, jobs):
    refusal = ["refused by budget: budget 'month: all spend' ($1.00 per month) would reach $1.50"]

    async def gate(spec_path, policy):
        assert policy == "hybrid"
        return refusal[0]

    eng = engine(db, jobs, [trigger(schedule="0 * * * *", policy="hybrid")], gate=gate)
    tick(eng, MONDAY)
    assert tick(eng, MONDAY + HOUR) == [] and eng.problems["t"] == refusal[0] and jobs.all() == []
    refusal[0] = None
    [fired] = tick(eng, MONDAY + HOUR + 60)
    assert fired.job_id and jobs.calls[-1][1] == "hybrid" and "t" not in eng.problems


def test_a_trigger_without_the_gate_ignores_it(db, jobs):
    async def gate(spec_path, policy):
        return "refused by budget"

    eng = engine(db, jobs, [trigger(schedule="0 * * * *", budget_gate=False)], gate=gate)
    tick(eng, MONDAY)
    assert len(tick(eng, MONDAY + HOUR)) == 1


def test_a_crash_between_record_and_submit_is_submitted_once_on_restart(db, jobs):
    first = engine(db, jobs, [trigger(schedule="0 1 * * *")])
    tick(first, MONDAY)
    jobs.crash_before = True
    with pytest.raises(Crash):
        tick(first, MONDAY + HOUR)
    assert jobs.all() == []
    jobs.crash_before = False
    restarted = engine(db, jobs, [trigger(schedule="0 1 * * *")])
    [fired] = tick(restarted, MONDAY + HOUR + 30)  # the recorded fire, not a new one
    assert fired.key == jobs.calls[0][2] and len(jobs.all()) == 1
    assert tick(restarted, MONDAY + HOUR + 60) == [] and len(jobs.all()) == 1


def test_a_crash_after_the_job_was_made_does_not_make_it_twice(db, jobs):
    first = engine(db, jobs, [trigger(schedule="0 1 * * *")])
    tick(first, MONDAY)
    jobs.crash_after = True
    with pytest.raises(Crash):
        tick(first, MONDAY + HOUR)
    [made] = jobs.all()
    jobs.crash_after = False
    [fired] = tick(engine(db, jobs, [trigger(schedule="0 1 * * *")]), MONDAY + HOUR + 30)
    assert fired.job_id == made and jobs.all() == [made]


def test_a_submit_error_ends_the_fire_and_the_data_counts_again(db, jobs, tmp_path):
    folder = tmp_path / "d"
    add_files(folder, 1)
    calls = []

    async def refusing(spec_path, policy, reason, key):
        calls.append(key)
        raise ValueError("job.yaml:3: resources: bad")

    eng = TriggerEngine(db, [trigger(data=Data(folder=folder, min_new=1))], refusing)
    [fired] = tick(eng, MONDAY)
    assert fired.job_id is None and fired.error == "job.yaml:3: resources: bad"
    [retry] = tick(eng, MONDAY + 10)
    assert retry.key != fired.key and calls == [fired.key, retry.key]


def test_manual_fire(db, jobs, tmp_path):
    folder = tmp_path / "d"
    add_files(folder, 2)
    eng = engine(db, jobs, [trigger("by-hand", manual=True), trigger("data", data=Data(folder=folder, min_new=10))])
    assert tick(eng, MONDAY) == []  # a manual trigger never fires by itself
    fired = asyncio.run(eng.fire("by-hand"))
    assert fired.reason == "trigger by-hand: manual" and fired.job_id
    with pytest.raises(TriggerRefused, match="its last run has not ended"):
        asyncio.run(eng.fire("by-hand"))
    with pytest.raises(TriggerRefused, match="no trigger 'nope'; known: by-hand, data"):
        asyncio.run(eng.fire("nope"))
    data_fire = asyncio.run(eng.fire("data"))  # below its threshold, fired by hand: its cursor is recorded
    jobs.end(data_fire.job_id)
    add_files(folder, 9, 2)
    assert tick(eng, MONDAY + 10) == []  # the two files the manual run took are the baseline


def test_run_ticks_until_stopped(db, jobs):
    eng = engine(db, jobs, [trigger(schedule="* * * * *")])
    now = [MONDAY]

    async def main():
        stop = asyncio.Event()
        task = asyncio.create_task(eng.run(stop, clock=lambda: now[0], interval_s=0.01))
        await asyncio.sleep(0.05)
        now[0] = MONDAY + 60
        for _ in range(200):
            await asyncio.sleep(0.01)
            if jobs.all():
                break
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
    assert len(jobs.all()) == 1
