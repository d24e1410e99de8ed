"""Broker overhead on the Bittensor path (a standing figure: ≤ 0.5 s from submit to the entrypoint's start, on
every backend): `trainmaster submit --wait` launched as a user runs it (a fresh CLI process) → the first line
of the job's script on a real `trainmaster miner serve` process, and the job recorded → that line. In between:
the spec and bundle, the miner's signed quote, the planner, the bundle streamed to the miner, the signed
dispatch, and the miner's own start of the attempt (its confined user and private view of the files).

The job is a plain script, not a runtime job: it commits to nothing, so it may go to a miner only because its
spec opts into outcome-only trust (an evaluator with a threshold, broker/auditability.py). Each run gets a
broker home of its own (the miner is the same)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bittensor_dqn import POLICY
from bittensor_setup import broker_wallet, miner_process

SCRIPT = """\
import time; started = time.time()
import os, pathlib
pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"], "times.json").write_text('{"started": %r}' % started)
import torch
from safetensors.torch import save_file
save_file({"w": torch.zeros(1)}, os.path.join(os.environ["TRAINMASTER_OUTPUT_DIR"], "model.safetensors"))
"""

EVALUATE = 'print(\'{"ran": 1}\')\n'


def one_run(root: Path, wallet, listed: dict, miner_home: Path, n: int) -> tuple[float, float]:
    """(submit → entrypoint start, job recorded → entrypoint start), in seconds."""
    code, home = root / f"job-{n}", root / f"broker-home-{n}"
    code.mkdir(parents=True)
    (code / "train.py").write_text(SCRIPT)
    (code / "evaluate.py").write_text(EVALUATE)
    (code / "job.yaml").write_text("name: overhead\nentrypoint: python train.py\n"
                                   "verification: {evaluator: python evaluate.py, thresholds: {ran: 1}}\n")
    (code / "policy.yaml").write_text(POLICY)
    (home / "config").mkdir(parents=True)
    (home / "config" / "backends.yaml").write_text(
        f"bittensor:\n  wallet:\n    name: {wallet.name}\n    path: {wallet.path}\n"
        f"  miners:\n    - hotkey: {listed['hotkey']}\n      url: {listed['url']}\n      coldkey: {listed['coldkey']}\n")
    env = {**os.environ, "TRAINMASTER_HOME": str(home)}
    t0 = time.time()
    out = subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "submit", str(code / "job.yaml"), "--policy",
                          str(code / "policy.yaml"), "--wait", "--json"], capture_output=True, text=True, env=env,
                         timeout=600)
    job = json.loads(out.stdout[out.stdout.index("{"):])
    [attempt] = job["attempts"]
    times = json.loads((miner_home / "jobs" / attempt["id"] / "outputs" / "times.json").read_text())
    status = subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "status", job["id"], "--json"],
                            capture_output=True, text=True, env=env)
    submitted = [e["at"] for e in json.loads(status.stdout)["events"] if e["to"] == "submitted"][0]
    return times["started"] - t0, times["started"] - submitted


def overhead_figures(root: Path, smoke: bool, miner: tuple | None = None) -> dict[str, float]:
    """The figures on `miner` ((its process, its listing), from `miner_process`; one of its own when None)."""
    if miner is None:
        with miner_process(root, "overhead-miner") as started:
            return overhead_figures(root, smoke, started)
    root.mkdir(parents=True, exist_ok=True)
    wallet = broker_wallet(root)
    proc, listed = miner
    samples = [one_run(root, wallet, listed, proc.home, n) for n in range(1 if smoke else 5)]
    return {"bittensor: submit → entrypoint start on the miner, median (s)": statistics.median(s[0] for s in samples),
            "bittensor: job recorded → entrypoint start on the miner, median (s)": statistics.median(s[1] for s in samples)}
