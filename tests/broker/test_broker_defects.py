"""Regression tests for the defects found in the broker's first version (each named as found)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from background_support import polled, stop_background
from broker_support import SyncBroker, sync_broker
from trainmaster.backends.local import LocalBackend
from trainmaster.broker import paths
from trainmaster.broker.cli import app

WRITE_OUTPUT = """
import os, pathlib
pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"], "result.txt").write_bytes(b"w" * 1000)
"""

CRASH_AFTER_RESERVE = """
import asyncio, os, sys
from trainmaster.broker.store import Store
Store.create_attempt = lambda self, *a, **k: os._exit(9)  # dies between Ledger.reserve and create_attempt
from trainmaster.broker.service import Broker
asyncio.run(Broker().submit(sys.argv[1]))
"""


def _ledger_rows(job_id):
    from trainmaster.wallet.ledger import Ledger

    with Ledger(paths.state_db()) as ledger:
        return [(e.kind, e.key, e.micro_usd) for e in ledger.entries() if e.job_id == job_id]


def _exit_recorded(job_id: str, n: int = 1, timeout: float = 30.0) -> None:
    from local_attempt import wait_ended

    wait_ended(paths.attempt_dir(job_id, n), timeout)


@pytest.mark.parametrize("cost_moved", [False, True], ids=["same-plan", "plan-moved"])
def test_1_a_crash_between_reserve_and_create_attempt_strands_nothing(tm_home, job_factory, cost_moved):
    spec = job_factory(WRITE_OUTPUT)
    crashed = subprocess.run([sys.executable, "-c", CRASH_AFTER_RESERVE, str(spec)], capture_output=True, text=True)
    assert crashed.returncode == 9, crashed.stderr
    broker = sync_broker()
    [job] = broker.store.jobs()
    assert job.state == "planned" and broker.store.attempts(job.id) == []
    [(kind, orphan, _)] = _ledger_rows(job.id)
    assert kind == "reserve"
    if cost_moved:  # as if the job had been re-planned at another price before the retry
        plan = json.loads(job.plan_json)
        plan.update(seq=plan["seq"] + 1, expected_micro_usd=plan["expected_micro_usd"] + 7)
        with broker.store.tx() as db:
            db.execute("UPDATE jobs SET plan_json = ? WHERE id = ?", (json.dumps(plan), job.id))
    listed = CliRunner().invoke(app, ["ls", "--json"])  # failed with IdempotencyConflict on every call before
    assert listed.exit_code == 0, listed.output
    done = broker.wait(job.id, timeout_s=60)
    assert done.state == "accepted", done.reason
    [attempt] = broker.store.attempts(job.id)
    rows = _ledger_rows(job.id)
    assert [k for k, _, _ in rows if k == "charge"] == ["charge"]  # paid once
    if cost_moved:
        assert ("release", f"release:{orphan}", 0) in rows and attempt.reserve_key != orphan
    else:
        assert attempt.reserve_key == orphan and [k for k, _, _ in rows] == ["reserve", "charge"]
    broker.close()


def _policy(tmp_path, name: str, usd_per_kwh_micro: int):
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\npower:\n  usd_per_kwh_micro: {usd_per_kwh_micro}\ndefault:\n  primary: local\n")
    return path


def test_4_each_policy_prices_local_runs_with_its_own_power_model(broker, job_factory, tmp_path):
    from trainmaster.broker.planning.policy import load_policy

    cheap, dear = load_policy(str(_policy(tmp_path, "cheap", 100_000))), load_policy(str(_policy(tmp_path, "dear", 400_000)))
    spec = job_factory(WRITE_OUTPUT)
    first = broker.submit(spec, str(tmp_path / "cheap.yaml"))
    second = broker.submit(spec, str(tmp_path / "dear.yaml"))  # the same long-lived broker
    prices = [json.loads(broker.store.job(j.id).plan_json)["offer"]["price_per_hour_micro_usd"] for j in (first, second)]
    assert prices == [cheap.power.price_per_hour_micro(0), dear.power.price_per_hour_micro(0)]
    assert broker.backend("local", cheap) is not broker.backend("local", dear)


class Counting(LocalBackend):
    """A local backend that counts the calls the broker makes."""

    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = {}

    def _count(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1

    async def offers(self, request):
        self._count("offers")
        return await super().offers(request)

    async def cost(self, handle, offer):
        self._count("cost")
        return await super().cost(handle, offer)

    async def fetch(self, handle, dest, progress=None):
        self._count("fetch")
        return await super().fetch(handle, dest, progress)


def test_5_planned_once_costed_once_hashed_once(tm_home, job_factory, monkeypatch):
    from trainmaster.broker.service import Broker
    from trainmaster.jobs import files

    hashed = []
    real = files.sha256_file
    monkeypatch.setattr(files, "sha256_file", lambda path: hashed.append(str(path)) or real(path))
    local = Counting()
    broker = SyncBroker(Broker(backends={"local": local}))
    job = broker.wait(broker.submit(job_factory(WRITE_OUTPUT)).id, timeout_s=60)
    assert job.state == "accepted", job.reason
    assert broker.offer_rounds == 1 and local.calls == {"offers": 1, "fetch": 1, "cost": 1}
    assert not [p for p in hashed if p.endswith("result.txt")]  # hashed while fetched, not again by verification
    broker.close()


def test_5_a_policy_edited_while_the_job_runs_does_not_change_it(tm_home, job_factory, tmp_path):
    policy = _policy(tmp_path, "mine", 100_000)
    broker = sync_broker()
    job = broker.submit(job_factory("import time\ntime.sleep(1)\n" + WRITE_OUTPUT), str(policy))
    policy.write_text("name: mine\ndefault:\n  primary: nowhere\n")  # now invalid: a re-parse would fail
    later = sync_broker()  # another process settles it, from the stored snapshot
    done = later.wait(job.id, timeout_s=60)
    assert done.state == "accepted", done.reason
    assert json.loads(done.policy_json)["power"]["usd_per_kwh_micro"] == 100_000
    broker.close(), later.close()


NO_PASS = {"TRAINMASTER_BACKGROUND_S": "0"}
"""A read starts no background pass (broker/cli/background_start.py): what moves a job is then the command alone."""


@pytest.mark.parametrize("command", ["status", "logs", "cancel"])
def test_6_a_job_command_advances_its_job_only_and_the_background_pass_brings_every_unfinished_job_up_to_date(
        tm_home, broker, job_factory, command):
    """#19 and #34 item 4: `status X` and `logs X` are reads: they move no job, X included; `cancel X` moves X alone
    — never another job's fetch or audit. `ls` answers at once and starts the bounded background pass (without a
    daemon; with one, the daemon keeps them up to date), which brings every unfinished job up to date."""
    finished = broker.submit(job_factory(WRITE_OUTPUT))
    other = broker.submit(job_factory("import time\ntime.sleep(30)\n"))
    _exit_recorded(finished.id)
    assert broker.store.job(finished.id).state in ("dispatched", "running")  # nobody has looked since
    before = len(broker.store.events(other.id))
    result = CliRunner().invoke(app, [command, other.id], env=NO_PASS)
    assert result.exit_code in (0, 1), result.output
    assert broker.store.job(finished.id).state in ("dispatched", "running")  # not this command's job
    if command == "cancel":
        assert broker.store.job(other.id).state == "cancelled"  # the command that acts moves its own job
    else:
        assert len(broker.store.events(other.id)) == before  # a read writes nothing, on its own job either

    def listed() -> dict:
        shown = CliRunner().invoke(app, ["ls", "--json"])  # each a user's read, starting the pass if none runs
        assert shown.exit_code == 0, shown.output
        return {j["id"]: j["state"] for j in json.loads(shown.output)}

    assert polled(listed, lambda jobs: jobs[finished.id] == "accepted")[finished.id] == "accepted"
    stop_background(tm_home)
    if command != "cancel":
        broker.cancel(other.id)


def test_bans_match_hotkeys_and_string_coldkeys_and_survive_odd_quotes():
    """An offer's detail is the executor's quote: a coldkey that is a list or a number must not break planning."""
    from trainmaster.backends.base import Offer, OfferSet
    from trainmaster.broker.stages.offer_rounds import banned_offers

    def offer(hotkey, coldkey):
        return Offer(backend="bittensor", instance=hotkey, region="subnet", price_per_hour_micro_usd=1, trusted=False,
                     detail={"coldkey": coldkey})

    sets = [OfferSet(backend="bittensor", offers=[offer("hk-a", "ck-1"), offer("hk-b", "ck-1"), offer("hk-c", ["ck-1"]),
                                                  offer("hk-d", 7), offer("hk-e", "ck-2")])]
    keys = banned_offers(sets, frozenset({"hk-e"}), frozenset({"ck-1"}))
    assert keys == {"bittensor/subnet/hk-a/on-demand", "bittensor/subnet/hk-b/on-demand", "bittensor/subnet/hk-e/on-demand"}
