"""Broker overhead of a local job: submit → the entrypoint starting, and the entrypoint exiting → outputs recorded.

The first is timed from launching `trainmaster submit` (a fresh CLI process, as a user runs it) to the
first line of the job's script; the second from the script's last line to the event row written
once the outputs are copied, hashed and recorded with the cost (`submit --wait` is watching; the
verification that follows is measured by the verification benchmarks). Both are shown
for the default launcher (one process started directly with torchrun's variables) and for torchrun,
whose own start-up (it imports torch before starting workers) is shown on its own line.
Target ≤ 1 s each. Run: python tests/benchmarks/bench_overhead.py
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
from _common import print_figures  # noqa: E402

SCRIPT = """\
import time; started = time.time()
import os, pathlib
out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
(out / "weights.dat").write_bytes(b"w" * 1_000_000)
(out / "times.json").write_text('{"started": %r, "exiting": %r}' % (started, time.time()))
"""


def one_run(root: Path, launcher: str) -> tuple[float, float]:
    code = root / f"job-{launcher}-{time.time_ns()}"
    code.mkdir()
    (code / "train.py").write_text(SCRIPT)
    (code / "job.yaml").write_text(f"name: overhead\nentrypoint: python train.py\nlauncher: {launcher}\n")
    env = {**os.environ, "TRAINMASTER_HOME": str(root / "home")}
    t0 = time.time()
    out = subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "submit", str(code / "job.yaml"), "--wait",
                          "--json"], capture_output=True, text=True, env=env, check=True)
    job = json.loads(out.stdout)
    times = json.loads((Path(job["outputs_dir"]) / "times.json").read_text())
    status = subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "status", job["id"], "--json"],
                            capture_output=True, text=True, env=env, check=True)
    recorded = [e["at"] for e in json.loads(status.stdout)["events"] if e["to"] == "verifying"][0]
    return times["started"] - t0, recorded - times["exiting"]


def run(smoke: bool = False) -> dict[str, float]:
    repeat = 1 if smoke else 5
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for launcher in ("auto", "torchrun") if not smoke else ("auto",):
            samples = [one_run(Path(tmp), launcher) for _ in range(repeat)]
            figures[f"{launcher}: submit → entrypoint start (s)"] = statistics.median(s[0] for s in samples)
            figures[f"{launcher}: entrypoint exit → outputs recorded (s)"] = statistics.median(s[1] for s in samples)
    if not smoke:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch.distributed.run"], check=True)
        figures["torchrun's own import of torch (s)"] = time.perf_counter() - start
    return figures


if __name__ == "__main__":
    print_figures("Broker overhead of a local job, median of 5", run(),
                  {"auto: submit → entrypoint start (s)": "≤ 1", "auto: entrypoint exit → outputs recorded (s)": "≤ 1"})
