"""One reconcile pass over many open jobs (1,000 in the full run, 20 in the smoke run): the wall time per pass.

The jobs run on a scripted backend (tests/scripted_backend.py) that reports each attempt running forever, so
every pass looks at every job (a status call, the lease claimed, renewed and released) and none ever ends; the
reconciler is the daemon's (`broker/daemon/reconciler.py`), with 4 workers each on its own WorkerLoop
(broker/daemon/worker_loop.py) as in the daemon, each pass unbounded (`limit` above
the job count), over SQLite in a temp home, then over PostgreSQL (a throwaway server started by
tests/postgres_server.py, TRAINMASTER_DATABASE_URL pointing at it). Prints, for each, the submit time, and the
first (dispatching) pass and the median and worst of the following ones.
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
    from trainmaster.broker.daemon.worker_loop import WorkerLoop
    from trainmaster.broker.service import Broker

    script = Script(status=RUNNING)
    loops = [WorkerLoop(f"bench-{i}") for i in range(WORKERS)]
    brokers = [await loop.call(lambda: Broker(backends={"local": Scripted(name="local", script=script)}))
               for loop in loops]
    leases = Leases(paths.state_db())
    try:
        spec = write_job(home.parent / "code", "print('never run')\n")
        began = time.perf_counter()
        for _ in range(jobs):
            await loops[0].submit(brokers[0].submit(spec))
        submitted = time.perf_counter() - began
        reconciler = Reconciler(brokers, leases, "bench", loops=loops)
        seconds = []
        for _ in range(passes + 1):
            result = await reconciler.run_pass(limit=jobs + 1, budget_s=3600)
            assert len(result.advanced) == jobs and not result.errors, result
            seconds.append(result.seconds)
        running = sum(1 for j in brokers[0].store.jobs(limit=jobs + 1) if j.state == "running")
    finally:
        for loop in loops:
            loop.stop()
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
    from postgres_server import PostgresServer

    jobs, passes = (20, 2) if smoke else (jobs, passes)
    figures = _run_on(jobs, passes, database_url=None)
    print_figures(f"reconcile passes over {jobs} open jobs (SQLite, {WORKERS} workers)", figures)
    server = PostgresServer().start()
    try:
        on_server = _run_on(jobs, passes, database_url=server.database())
    finally:
        server.stop()
    print_figures(f"reconcile passes over {jobs} open jobs (PostgreSQL, {WORKERS} workers)", on_server)
    return {**figures, **{f"postgresql_{name}": value for name, value in on_server.items()}}


def _run_on(jobs: int, passes: int, *, database_url: str | None) -> dict[str, float]:
    """The figures with a temp home, the state in it (SQLite) or on the server at `database_url` (with the shared
    storage a broker on a server needs, a temp folder)."""
    with tempfile.TemporaryDirectory() as tmp:
        shared = Path(tmp) / "shared"
        shared.mkdir()
        settings = {"TRAINMASTER_HOME": str(Path(tmp) / "home"), "TRAINMASTER_DATABASE_URL": database_url,
                    "TRAINMASTER_SHARED_STORAGE": str(shared) if database_url else None}
        before = {name: os.environ.get(name) for name in settings}
        _set(settings)
        try:
            return asyncio.run(_measure(Path(tmp) / "home", jobs, passes))
        finally:
            _set(before)


def _set(environment: dict[str, str | None]) -> None:
    for name, value in environment.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args()
    run(jobs=args.jobs, passes=args.passes)
