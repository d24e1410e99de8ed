"""Broker overhead of the same job on the local backend and through the remote harness (tests/remote_executor:
the executor a separate process on 127.0.0.1 with its own home, reached over HTTP only).

For each: `trainmaster submit --wait` launched as a user runs it (a fresh CLI process) → the first line of
the job's script, the job recorded → that line, and the script's last line → the event row written once
the outputs are fetched, hashed and recorded. The remote figures add the bundle upload, the attempt's
start on the executor, the status polls over HTTP and the streamed fetch. The harness is registered as a
trusted backend here (the job is a plain script, not a runtime job, so an untrusted executor's replay
audit would refuse it): both runs get the same checks, and only the path to the compute differs.

Run: python tests/benchmarks/bench_remote.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from _common import print_figures  # noqa: E402

SCRIPT = """\
import time; started = time.time()
import os, pathlib
out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
(out / "weights.dat").write_bytes(b"w" * 1_000_000)
(out / "times.json").write_text('{"started": %r, "exiting": %r}' % (started, time.time()))
"""
LOCAL_CLI = "trainmaster.broker.cli"
REMOTE_CLI = "remote_executor.cli"


def one_run(root: Path, cli: str, env: dict[str, str]) -> tuple[float, float, float]:
    """(submit → entrypoint start, job recorded → entrypoint start, entrypoint exit → outputs recorded)."""
    code = root / f"job-{time.time_ns()}"
    code.mkdir()
    (code / "train.py").write_text(SCRIPT)
    (code / "job.yaml").write_text("name: overhead\nentrypoint: python train.py\n")
    t0 = time.time()
    out = subprocess.run([sys.executable, "-m", cli, "submit", str(code / "job.yaml"), "--wait", "--json"],
                         capture_output=True, text=True, env=env, check=True)
    job = json.loads(out.stdout[out.stdout.index("{"):])
    times = json.loads((Path(job["outputs_dir"]) / "times.json").read_text())
    status = subprocess.run([sys.executable, "-m", cli, "status", job["id"], "--json"], capture_output=True,
                            text=True, env=env, check=True)
    events = json.loads(status.stdout)["events"]
    recorded = [e["at"] for e in events if e["to"] == "verifying"][0]
    submitted = [e["at"] for e in events if e["to"] == "submitted"][0]
    return times["started"] - t0, times["started"] - submitted, recorded - times["exiting"]


def _medians(figures: dict, label: str, samples: list) -> None:
    figures[f"{label}: submit → entrypoint start (s)"] = statistics.median(s[0] for s in samples)
    figures[f"{label}: job recorded → entrypoint start (s)"] = statistics.median(s[1] for s in samples)
    figures[f"{label}: entrypoint exit → outputs recorded (s)"] = statistics.median(s[2] for s in samples)


def run(smoke: bool = False) -> dict[str, float]:
    from remote_executor import protocol
    from remote_executor.cli import TRUSTED_ENV
    from remote_executor.process import TESTS, ExecutorProcess

    repeat = 1 if smoke else 5
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        executor = ExecutorProcess(root / "executor").start()
        try:
            base = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
            local = {**base, "TRAINMASTER_HOME": str(root / "local-home")}
            remote = {**base, "TRAINMASTER_HOME": str(root / "broker-home"), protocol.URL_ENV: executor.url,
                      TRUSTED_ENV: "1"}
            ours, theirs = [], []
            for _ in range(repeat):  # interleaved, so a busy moment hits both alike
                ours.append(one_run(root, LOCAL_CLI, local))
                theirs.append(one_run(root, REMOTE_CLI, remote))
        finally:
            executor.stop()
    _medians(figures, "local", ours)
    _medians(figures, "remote harness", theirs)
    return figures


if __name__ == "__main__":
    print_figures("Broker overhead, local backend vs the remote harness (same job), median of 5", run())
