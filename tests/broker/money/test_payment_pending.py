"""#33 §1: a TAO payment that cannot be sent now is a state the user sees, and no command crashes on it.

Through the real CLI, a real `trainmaster miner serve` and `bittensor.payments: tao` with the chain unreachable
(a ws:// endpoint nothing listens on, through the SDK's own RPC client): `submit --wait`, `status` (in an
80-column terminal), `status --json` and `spend` each exit cleanly and say the payment is pending, why, and when
it is tried next, and who sends it. The reads try nothing before its time. Once the chain answers
(tests/cli_with_chain.py: the SDK's Substrate replaced by the in-memory chain of tests/fake_chain.py, kept in a
file, in the CLI and the processes it starts), the background pass the next read starts pays it, without a
daemon and without the read waiting for it, exactly once however many commands follow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from background_support import polled
from cli_with_chain import load, save
from fake_chain import FakeSubstrate
from miner_support import MinerProcess, free_port, make_wallet
from pty_run import in_terminal
from tiny_lm_job import EVALUATOR, short_job
from repo_paths import TESTS
from trainmaster.broker.cli import background_start

pytestmark = pytest.mark.slow

PRICES = {"prices": {"rao_per_gpu_hour": {"cpu": 2_000_000_000}}, "default_hours": 0.25}
POLICY = "name: tao\ndefault:\n  primary: bittensor\ntao_rate:\n  usd_per_tao: 400\nverification:\n  tau: 0.01\n"
HERE = TESTS


def _tm(home: Path, *args: str, chain: Path | None = None) -> subprocess.CompletedProcess:
    runner = [sys.executable, str(HERE / "cli_with_chain.py"), str(chain)] if chain else \
        [sys.executable, "-m", "trainmaster.broker.cli"]
    return subprocess.run([*runner, *args], capture_output=True, text=True, timeout=280,
                          env={**os.environ, "TRAINMASTER_HOME": str(home), "COLUMNS": "200"})


@pytest.fixture
def miner(tmp_path):
    proc = MinerProcess(tmp_path / "miner", make_wallet(tmp_path / "wallets", "miner"), config=PRICES).start()
    yield proc
    proc.stop()


def test_a_payment_the_chain_cannot_take_now_is_pending_then_paid_once(tmp_path, tm_home, miner):
    broker = make_wallet(tmp_path / "wallets", "broker")
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.yaml").write_text(short_job())  # what is paid does not depend on the run's length
    (job / "evaluate.py").write_text(EVALUATOR)
    (tmp_path / "policy.yaml").write_text(POLICY)
    (tm_home / "config").mkdir(parents=True)
    (tm_home / "config" / "backends.yaml").write_text(
        f"bittensor:\n  network: ws://127.0.0.1:{free_port()}\n  payments: tao\n"
        f"  wallet:\n    name: broker\n    path: {tmp_path / 'wallets'}\n  quote_timeout_s: 5\n"
        f"  miners:\n    - hotkey: {miner.hotkey}\n      url: {miner.url}\n")

    done = _tm(tm_home, "submit", str(job / "job.yaml"), "--policy", str(tmp_path / "policy.yaml"), "--wait", "--json")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    shown = json.loads(done.stdout)
    assert shown["state"] == "accepted"
    [payment] = shown["payments"]
    assert payment["state"] == "pending" and payment["payee"] == miner.hotkey and payment["rao"] > 0
    assert "chain is unreachable" in payment["reason"], payment
    assert payment["tries"] == 1 and payment["next_try_at"] > time.time()
    job_id = shown["id"]

    screen = in_terminal("status", job_id, home=tm_home, columns=80)
    assert screen.code == 0 and "Traceback" not in screen.text, screen.text
    assert "PENDING, not sent" in screen.text and "next try after" in screen.text, screen.text
    said = " ".join(screen.text.split())  # who sends it: no read itself, and no daemon is needed
    assert "(by the daemon, or the background pass the next `trainmaster ls`, `status` or `spend` starts)" in said, said
    assert all(len(line) <= 80 for line in screen.lines if "job dir:" not in line and "outputs:" not in line)
    again = _tm(tm_home, "status", job_id, "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["payments"][0]["tries"] == 1  # not tried before due
    spend = _tm(tm_home, "spend")
    assert spend.returncode == 0 and "1 payment(s) charged but not sent yet" in spend.stdout, spend.stdout
    rows = json.loads(_tm(tm_home, "spend", "--json").stdout)
    assert rows[0]["unsent_payments"] == 1 and rows[0]["unsent_rao"] == payment["rao"]
    assert polled(lambda: background_start.running(tm_home), lambda runs: not runs, timeout=60) is False
    shown = json.loads(_tm(tm_home, "status", job_id, "--json").stdout)["payments"][0]
    assert shown["tries"] == 1 and shown["state"] == "pending"  # the passes those reads started tried nothing

    chain_file = tmp_path / "chain.json"
    save(chain_file, FakeSubstrate(free={broker.coldkeypub.ss58_address: 100 * payment["rao"]}))
    time.sleep(max(0.0, payment["next_try_at"] - time.time()) + 0.5)  # its retry time comes
    # the chain answers now; no daemon runs: a read (here `spend`, answered before typer) starts the background
    # pass, which pays it; the reads never wait for it, and read again until the pass has paid
    unsent = polled(lambda: json.loads(_tm(tm_home, "spend", "--json", chain=chain_file).stdout)[0]["unsent_payments"],
                    lambda left: left == 0, timeout=120)
    assert unsent == 0
    for _ in range(3):  # the later reads (and the passes they start) find it paid
        paid = _tm(tm_home, "status", job_id, "--json", chain=chain_file)
        assert paid.returncode == 0, paid.stderr[-2000:]
    assert polled(lambda: background_start.running(tm_home), lambda runs: not runs, timeout=60) is False
    chain = load(chain_file)
    assert [(x.dest, x.rao, x.success) for x in chain.landed] == [(miner.hotkey, payment["rao"], True)]
    [sent] = json.loads(paid.stdout)["payments"]
    assert sent["state"] == "sent" and sent["transfer"] == chain.landed[0].extrinsic_hash
    assert "not sent" not in _tm(tm_home, "spend").stdout
