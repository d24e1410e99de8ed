"""The shipped DQN job (configs/examples/dqn/job.yaml: T = 10,000 steps, k = 25, the default q = 8) end to end
through a real `trainmaster miner serve` process on 127.0.0.1, from `trainmaster submit --wait` under a
policy whose primary is bittensor: quote → upload → run on the miner → signed commitment → challenge →
the broker's replay audit → accepted → concluded → payment recorded.

* The audit's compute over the job's training compute: the re-execution of the challenged segments (the
  verdict's `replay_seconds`, the broker's CPU work) over the miner's run up to its last step (the attempt's
  start → the last write of metrics.jsonl on the miner, its start-up included); and the whole verification
  stage (the verdict's checks: fetching the challenged segments, hashing, the safety scan, the replay, the
  outcome) over the same.
* The wall time from the miner's last step to the payment record (payments.created_at): the miner's
  self-check and commitment, the broker's polling, download, verification, conclusion and payment.

τ is given in the policy (as the CLI tests do) instead of a calibration: the audit's work is the same.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from bittensor_setup import broker_wallet, miner_process

JOB = Path(__file__).parents[2] / "configs" / "examples" / "dqn"
SMOKE_ENTRYPOINT = ("python -m trainmaster.jobs.recipes.dqn --steps 100 --learning-starts 30 --buffer-size 200 "
                    "--batch-size 16")
POLICY = "name: tao\ndefault:\n  primary: bittensor\ntao_rate:\n  usd_per_tao: 400\nverification:\n  tau: 0.01\n"
DEADLINE_S = 900


def setup(root: Path, wallet, listed: dict, smoke: bool) -> tuple[Path, Path, Path]:
    """(job.yaml, policy.yaml, the broker's home) with backends.yaml naming the miner."""
    job = root / "job"
    shutil.copytree(JOB, job)
    if smoke:
        spec = job / "job.yaml"
        spec.write_text(re.sub(r"(?m)^entrypoint: .*$", f"entrypoint: {SMOKE_ENTRYPOINT}", spec.read_text()))
    (root / "policy.yaml").write_text(POLICY)
    home = root / "broker-home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "backends.yaml").write_text(
        f"bittensor:\n  wallet:\n    name: {wallet.name}\n    path: {wallet.path}\n"
        f"  miners:\n    - hotkey: {listed['hotkey']}\n      url: {listed['url']}\n      coldkey: {listed['coldkey']}\n")
    return job / "job.yaml", root / "policy.yaml", home


def submit(spec: Path, policy: Path, home: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "submit", str(spec), "--policy", str(policy),
                           "--wait", "--json"], capture_output=True, text=True, timeout=DEADLINE_S,
                          env={**os.environ, "TRAINMASTER_HOME": str(home)})
    assert done.returncode == 0 and "{" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    shown = json.loads(done.stdout[done.stdout.index("{"):])
    assert shown["state"] == "accepted", shown
    return shown


def one(db: Path, sql: str, *args):
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, args).fetchone()
    finally:
        conn.close()


def dqn_figures(root: Path, smoke: bool, miner: tuple | None = None) -> dict[str, float]:
    """The figures on `miner` ((its process, its listing), from `miner_process`; one of its own when None)."""
    if miner is None:
        with miner_process(root, "dqn-miner") as started:
            return dqn_figures(root, smoke, started)
    root.mkdir(parents=True, exist_ok=True)
    wallet = broker_wallet(root)
    proc, listed = miner
    spec, policy, home = setup(root, wallet, listed, smoke)
    shown = submit(spec, policy, home)
    [attempt] = shown["attempts"]
    outputs = proc.home / "jobs" / attempt["id"] / "outputs"
    last_step = (outputs / "metrics.jsonl").stat().st_mtime
    steps = json.loads((outputs / "result.json").read_text())["steps"]
    db = home / "state.db"
    [paid_at] = one(db, "SELECT created_at FROM payments WHERE attempt_id = ?", attempt["id"])
    [started_at] = one(db, "SELECT started_at FROM attempts WHERE id = ?", attempt["id"])
    verdict = json.loads((home / "jobs" / shown["id"] / "verdict.json").read_text())
    replay = verdict["evidence"]["replay"]
    training = last_step - started_at
    audited = len(replay["segments"])
    return {
        f"DQN T={steps}: the attempt's start → its last step on the miner (s)": training,
        f"DQN T={steps}: segments re-executed by the audit": float(audited),
        f"DQN T={steps}: audit re-execution (s)": replay["replay_seconds"],
        f"DQN T={steps}: audit replay / training": replay["replay_seconds"] / training,
        f"DQN T={steps}: last step on the miner → payment recorded (s)": paid_at - last_step,
    }
