"""One reconcile pass over many open jobs (1,000 in the full run, 20 in the smoke run): the wall time per pass.

The jobs run on a scripted backend (tests/scripted_backend.py) that reports each attempt running forever, so
every pass looks at every job (a status call, the lease claimed, renewed and released) and none ever ends; the
reconciler is the daemon's (`broker/daemon/reconciler.py`), with 4 workers, over SQLite in a temp home, each
pass unbounded (`limit` above the job count). Prints the submit time, and the first (dispatching) pass and the
median and worst of the following ones.
Run: python tests/benchmarks/bench_daemon_open_jobs.py [--jobs N] [--passes P]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parent.parent))
from _common import print_figures  # noqa: E402

WORKERS = 4


async def _measure(home: Path, jobs: int, passes: int) -> dict[str, float]:
    from conftest import write_job
    from scripted_backend import RUNNING, Script, Scripted

    from trainmaster.broker import paths
    from trainmaster.broker.daemon.leases import Leases
    from trainmaster.broker.daemon.reconciler import Reconciler
    from trainmaster.broker.service import Broker

    script = Script(status=RUNNING)
    brokers = [Broker(backends={"local": Scripted(name="local", script=script)}) for _ in range(WORKERS)]
    leases = Leases(paths.state_db())
    try:
        spec = write_job(home.parent / "code", "print('never run')\n")
        began = time.perf_counter()
        for _ in range(jobs):
            await brokers[0].submit(spec)
        submitted = time.perf_counter() - began
        reconciler = Reconciler(brokers, leases, "bench")
        seconds = []
        for _ in range(passes + 1):
            result = await reconciler.run_pass(limit=jobs + 1, budget_s=3600)
            assert len(result.advanced) == jobs and not result.errors, result
            seconds.append(result.seconds)
        running = sum(1 for j in brokers[0].store.jobs(limit=jobs + 1) if j.state == "running")
    finally:
        for broker in brokers:
            broker.close()
        leases.close()
    return {
        "open_jobs": float(jobs),
        "running": float(running),
        "submit_all_s": submitted,
        "first_pass_s": seconds[0],
        "pass_p50_s": statistics.median(seconds[1:]),
        "pass_max_s": max(seconds[1:]),
        "pass_per_job_ms": statistics.median(seconds[1:]) / jobs * 1000,
    }


def run(smoke: bool = False, jobs: int = 1000, passes: int = 5) -> dict[str, float]:
    jobs, passes = (20, 2) if smoke else (jobs, passes)
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        before = os.environ.get("TRAINMASTER_HOME")
        os.environ["TRAINMASTER_HOME"] = str(home)
        try:
            figures = asyncio.run(_measure(home, jobs, passes))
        finally:
            if before is None:
                os.environ.pop("TRAINMASTER_HOME")
            else:
                os.environ["TRAINMASTER_HOME"] = before
    print_figures(f"reconcile passes over {jobs} open jobs (SQLite, {WORKERS} workers)", figures)
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args()
    run(jobs=args.jobs, passes=args.passes)
