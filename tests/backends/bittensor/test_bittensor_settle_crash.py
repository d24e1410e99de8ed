"""An honest Bittensor miner (a real `trainmaster miner serve` process) is paid exactly once and told its
conclusion once, also when the broker is killed (os._exit, as kill -9) right after the verdict is stored,
after the charge and its payment are recorded, after the transfer is made and after the miner countersigned
its conclusion: each restart (tests/bittensor_settle_driver.py: `Broker.advance` of the job, as a command that
names it runs it) takes up where the last one died. One payment row, one transfer id, one verdict, one conclusion,
countersigned by the miner's hotkey and kept by the miner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from miner_support import MinerProcess, make_wallet
from tiny_lm_job import EVALUATOR, short_job
from state_rows import state_rows
from repo_paths import TESTS

pytestmark = pytest.mark.slow

PRICES = {"prices": {"rao_per_gpu_hour": {"cpu": 2_000_000_000}}, "default_hours": 0.25}
POLICY = "name: tao\ndefault:\n  primary: bittensor\ntao_rate:\n  usd_per_tao: 400\nverification:\n  tau: 0.01\n"


@pytest.fixture
def miner(tmp_path):
    proc = MinerProcess(tmp_path / "miner", make_wallet(tmp_path / "wallets", "miner"), config=PRICES).start()
    yield proc
    proc.stop()


def _setup(tmp_path: Path, tm_home: Path, miner: MinerProcess) -> tuple[Path, Path]:
    make_wallet(tmp_path / "wallets", "broker")
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.yaml").write_text(short_job())  # 4 segments of 10 steps: the crashes are after the run
    (job / "evaluate.py").write_text(EVALUATOR)
    (tmp_path / "policy.yaml").write_text(POLICY)
    (tm_home / "config").mkdir(parents=True)
    (tm_home / "config" / "backends.yaml").write_text(
        f"bittensor:\n  wallet:\n    name: broker\n    path: {tmp_path / 'wallets'}\n  quote_timeout_s: 5\n"
        f"  miners:\n    - hotkey: {miner.hotkey}\n      url: {miner.url}\n"
        f"      coldkey: {miner.wallet.coldkeypub.ss58_address}\n")
    return job / "job.yaml", tmp_path / "policy.yaml"


def _driver(point: str, spec: Path, policy: Path, state: Path) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(TESTS / "bittensor_settle_driver.py"), point, str(spec), str(policy),
                           str(state)], env=env, timeout=300).returncode


def test_an_honest_miner_is_paid_and_concluded_exactly_once_across_kill_9_at_every_step(tmp_path, tm_home, miner):
    from trainmaster.wallet.keys import signed_by

    spec, policy = _setup(tmp_path, tm_home, miner)
    state = tmp_path / "driver"
    state.mkdir()
    for point in ("verdict", "charge", "transfer", "conclude"):
        assert _driver(point, spec, policy, state) == 9, point  # it died where it was told to
    assert _driver("none", spec, policy, state) == 0
    job_id = (state / "job_id").read_text()
    done = subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "status", job_id, "--json"],
                          capture_output=True, text=True, timeout=120)
    shown = json.loads(done.stdout[done.stdout.index("{"):])
    assert shown["state"] == "accepted", shown
    [attempt] = shown["attempts"]
    assert attempt["state"] == "accepted" and (miner.home / "jobs" / attempt["id"]).is_dir()

    db = tm_home / "state.db"
    charges = state_rows(db, "SELECT kind, rao FROM ledger_entries WHERE job_id = ? ORDER BY seq", job_id)
    assert [c["kind"] for c in charges] == ["reserve", "charge"] and charges[1]["rao"] > 0
    [payment] = state_rows(db, "SELECT key, payee, rao, attempt_id, transfer FROM payments WHERE job_id = ?", job_id)
    transfers = [json.loads(line) for line in (state / "transfers.jsonl").read_text().splitlines()]
    owner = miner.wallet.coldkeypub.ss58_address  # TAO goes to the miner's coldkey
    assert transfers == [{"key": payment["key"], "payee": owner, "rao": charges[1]["rao"], "transfer": "tx-1"}]
    assert (payment["payee"], payment["rao"], payment["attempt_id"], payment["transfer"]) == \
        (owner, charges[1]["rao"], attempt["id"], "tx-1")
    verdicts = state_rows(db, "SELECT outcome FROM verdicts WHERE job_id = ?", job_id)
    assert [v["outcome"] for v in verdicts] == ["accepted"]  # not verified again after a crash

    [told] = state_rows(db, "SELECT receipt, countersignature FROM conclusions WHERE attempt_id = ?", attempt["id"])
    assert signed_by(told["receipt"].encode(), told["countersignature"], miner.hotkey)
    receipt = json.loads(told["receipt"])
    assert (receipt["verdict"], receipt["amount_rao"], receipt["transfer"]) == ("accepted", charges[1]["rao"], "tx-1")
    [kept] = state_rows(miner.home / "miner.db",
                        "SELECT told_json, countersignature FROM attempts WHERE attempt_id = ?",
                   attempt["id"])  # the miner kept the one conclusion it countersigned
    assert json.loads(kept["told_json"])["receipt"] == told["receipt"]
    assert kept["countersignature"] == told["countersignature"]
