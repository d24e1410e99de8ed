"""Broker overhead of a local job: submit → the entrypoint starting, the entrypoint exiting → outputs recorded,
and submit → accepted minus the job's own run time; plus how often offers are gathered per dispatch.

The first is timed from launching `trainmaster submit` (a fresh CLI process, as a user runs it) to the
first line of the job's script; the second from the script's last line to the event row written
once the outputs are copied, hashed and recorded with the cost (`submit --wait` is watching; the
verification that follows is measured by the verification benchmarks). Both are shown
for the default launcher (one process started directly with torchrun's variables) and for torchrun,
whose own start-up (it imports torch before starting workers) is shown on its own line.
Targets: ≤ 0.5 s from the job being recorded to the entrypoint's start (the broker's own part; the figure from
launching the CLI adds the interpreter's start-up and imports); the whole overhead must not grow from one
version to the next.

To compare with an older version, point TRAINMASTER_BENCH_BASELINE at a checkout of it: its figures are
measured the same way, with that tree imported as `trainmaster` (through a folder of links put first on
PYTHONPATH) and this machine's installed dependencies.

Run: python tests/benchmarks/bench_overhead.py
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


def one_run(root: Path, launcher: str, pythonpath: str | None = None) -> tuple[float, float, float, float]:
    code = root / f"job-{launcher}-{time.time_ns()}"
    code.mkdir()
    (code / "train.py").write_text(SCRIPT)
    (code / "job.yaml").write_text(f"name: overhead\nentrypoint: python train.py\nlauncher: {launcher}\n")
    env = {**os.environ, "TRAINMASTER_HOME": str(root / ("home-baseline" if pythonpath else "home"))}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    t0 = time.time()
    out = subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "submit", str(code / "job.yaml"), "--wait",
                          "--json"], capture_output=True, text=True, env=env, check=True)
    total = time.time() - t0
    job = json.loads(out.stdout[out.stdout.index("{"):])
    times = json.loads((Path(job["outputs_dir"]) / "times.json").read_text())
    status = subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "status", job["id"], "--json"],
                            capture_output=True, text=True, env=env, check=True)
    events = json.loads(status.stdout)["events"]
    recorded = [e["at"] for e in events if e["to"] == "verifying"][0]
    submitted = [e["at"] for e in events if e["to"] == "submitted"][0]
    return (times["started"] - t0, recorded - times["exiting"], total - (times["exiting"] - times["started"]),
            times["started"] - submitted)


def offer_rounds_per_dispatch(root: Path) -> float:
    """How many times offers are gathered for one job that is submitted, dispatched and accepted."""
    import asyncio

    from trainmaster.broker.service import Broker

    code = root / "rounds"
    code.mkdir()
    (code / "train.py").write_text(SCRIPT)
    (code / "job.yaml").write_text("name: rounds\nentrypoint: python train.py\n")
    os.environ["TRAINMASTER_HOME"] = str(root / "rounds-home")
    broker = Broker()

    async def main():
        job = await broker.submit(code / "job.yaml")
        return await broker.wait(job.id)

    try:
        assert asyncio.run(main()).state == "accepted"
        return float(broker.offer_rounds)
    finally:
        broker.close()
        del os.environ["TRAINMASTER_HOME"]


def _baseline_path(tree: Path, root: Path) -> str:
    """A folder holding `trainmaster/` whose subpackages are links into an older checkout."""
    package = root / "baseline" / "trainmaster"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name in ("broker", "backends", "jobs", "verify", "wallet", "configs"):
        (package / name).symlink_to(tree.resolve() / name)
    return str(package.parent)


def _overheads(figures: dict, label: str, samples: list) -> None:
    figures[f"{label}: submit → entrypoint start (s)"] = statistics.median(s[0] for s in samples)
    figures[f"{label}: entrypoint exit → outputs recorded (s)"] = statistics.median(s[1] for s in samples)
    figures[f"{label}: submit → accepted minus the job's run (s)"] = statistics.median(s[2] for s in samples)
    figures[f"{label}: job recorded → entrypoint start (s)"] = statistics.median(s[3] for s in samples)


def run(smoke: bool = False) -> dict[str, float]:
    repeat = 1 if smoke else 10
    figures: dict[str, float] = {}
    baseline = os.environ.get("TRAINMASTER_BENCH_BASELINE")
    with tempfile.TemporaryDirectory() as tmp:
        figures["offer gatherings per dispatched job"] = offer_rounds_per_dispatch(Path(tmp))
        path = _baseline_path(Path(baseline), Path(tmp)) if baseline and not smoke else None
        ours, theirs = [], []
        for _ in range(repeat):  # interleaved with the baseline, so a busy moment hits both alike
            ours.append(one_run(Path(tmp), "auto"))
            if path:
                theirs.append(one_run(Path(tmp), "auto", path))
        _overheads(figures, "auto", ours)
        if theirs:
            _overheads(figures, "baseline auto", theirs)
        if not smoke:
            _overheads(figures, "torchrun", [one_run(Path(tmp), "torchrun") for _ in range(3)])
    if not smoke:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch.distributed.run"], check=True)
        figures["torchrun's own import of torch (s)"] = time.perf_counter() - start
    return figures


if __name__ == "__main__":
    print_figures("Broker overhead of a local job, median of 10 (torchrun: of 3)", run(),
                  {"auto: job recorded → entrypoint start (s)": "≤ 0.5", "auto: entrypoint exit → outputs recorded (s)": "≤ 1",
                   "offer gatherings per dispatched job": "1"})
