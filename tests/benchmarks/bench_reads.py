"""Reads never write (#34 item 4): `ls`, `status ID` and `spend` against a bare interpreter (`python -c pass`), each
run paired with a bare run right after it, median of N, wall and CPU seconds over bare, on three homes:

- 3 running jobs (real local jobs sleeping; the background pass the reads start advances them meanwhile),
- 1,000 finished jobs (one run for real, the rest written through the Store as copies of its rows),
- the 3 running jobs with the model registry's server down (registry.yaml names a port nobody listens on, and an
  accepted job's promotion waits for it).

Before this change `ls` ran a reconcile pass whenever a job was unfinished (0.5–1.3 s with 3 running jobs) and
waited on the registry's timeout when it was down (3+ s). Target: every read ≤ 0.10 s over bare.
Run: python tests/benchmarks/bench_reads.py
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import print_figures  # noqa: E402
from bench_cli import _timed, ended_jobs_home, trainmaster_command
from bench_cli import _job as tiny_job  # noqa: E402

FINISHED = 1000
RUNNING = 3
TARGET_OVER_BARE_S = 0.10
SLEEPER = "import time\ntime.sleep(600)\n"
MAKE_MODEL = """\
import json, os, pathlib, struct
out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
(out / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<f", 1.0))
"""


def _job(root: Path, script: str, extra: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text(script)
    (root / "job.yaml").write_text(f"name: {root.name}\nentrypoint: python train.py\n{extra}")
    return root / "job.yaml"


def _tm(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRAINMASTER_HOME": str(home)}
    return subprocess.run([*trainmaster_command(), *args], env=env, capture_output=True, text=True, check=True,
                          timeout=300)


def running_home(home: Path, root: Path, n: int) -> list[str]:
    return [json.loads(_tm(home, "submit", str(_job(root / f"sleeper{i}", SLEEPER)), "--json").stdout)["id"]
            for i in range(n)]


def finished_home(home: Path, root: Path, n: int) -> str:
    return ended_jobs_home(home, tiny_job(root / "tiny"), n)


def registry_down(home: Path, root: Path) -> str:
    """An accepted job whose promotion waits for a registry nobody answers at."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (home / "config").mkdir(parents=True, exist_ok=True)
    (home / "config" / "registry.yaml").write_text(
        f"mlflow:\n  tracking_uri: http://127.0.0.1:{port}\n  timeout_s: 3\n  retries: 0\n")
    spec = _job(root / "model", MAKE_MODEL, "verification:\n  evaluator: python evaluate.py\n"
                                            "  thresholds:\n    score: 0.5\n")
    (spec.parent / "evaluate.py").write_text('import json\nprint(json.dumps({"score": 0.9}))\n')
    out = _tm(home, "submit", str(spec), "--wait", "--json").stdout
    return json.loads(out[out.index("{"):])["id"]


def _measure(figures: dict, label: str, home: Path, job_id: str, repeat: int) -> None:
    env = {**os.environ, "TRAINMASTER_HOME": str(home), "COLUMNS": "120"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: compiled once (the warm-up run), not at every start
    bare = [sys.executable, "-c", "pass"]
    for name, args in {"ls": ["ls"], "status ID": ["status", job_id], "spend": ["spend"]}.items():
        _timed([*trainmaster_command(), *args], env)  # warm-up
        runs = [(_timed([*trainmaster_command(), *args], env), _timed(bare, env)) for _ in range(repeat)]
        for i, what in enumerate(("wall", "cpu")):
            command_s = statistics.median(c[i] for c, _ in runs)
            bare_s = statistics.median(b[i] for _, b in runs)
            figures[f"{label}: {name} {what} over bare (s)"] = command_s - bare_s
            figures[f"{label}: {name} {what} / bare"] = command_s / bare_s


def run(smoke: bool = False) -> dict[str, float]:
    repeat = 2 if smoke else 15
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-reads-") as tmp:
        root = Path(tmp)
        busy, down, done = root / "busy", root / "down", root / "done"
        registry_down(down, root / "code")  # first: the sleepers would hold the local machine
        started = {}
        try:
            for home in (busy, down):
                started[home] = running_home(home, root / "code", RUNNING)
            _measure(figures, f"{RUNNING} running", busy, started[busy][0], repeat)
            _measure(figures, f"{RUNNING} running, registry down", down, started[down][0], repeat)
        finally:
            for home, ids in started.items():
                for job_id in ids:
                    _tm(home, "cancel", job_id)
        finished = finished_home(done, root / "code", 20 if smoke else FINISHED)
        _measure(figures, f"{20 if smoke else FINISHED} finished", done, finished, repeat)
    return figures


if __name__ == "__main__":
    figures = run()
    targets = {key: f"≤ {TARGET_OVER_BARE_S:.2f}" for key in figures if key.endswith("over bare (s)")}
    print_figures(f"Reads (ls, status, spend), median of 15 paired runs, {RUNNING} running / {FINISHED} finished jobs",
                  figures, targets)
