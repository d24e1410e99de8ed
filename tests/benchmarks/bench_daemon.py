"""The daemon under a stream of small jobs: API submit latency (p50/p99) at N submissions per second, and its
resident memory over time (bounded memory: no cache grows with the jobs it has seen), with the state on SQLite
and on PostgreSQL.

A real daemon (`python -m trainmaster.broker.daemon`) on 127.0.0.1 in a temp home; each submission is a one-line
job on the local backend, so the reconciler advances them to `accepted` while more arrive. Prints RSS every
few seconds, the latency percentiles, how many jobs ended accepted, the RSS at the start, after 30 s (half
the run when shorter) and at the end, and the RSS growth per 100 jobs over the second half of the submissions
(from the first sample past half time to the last one): the figure that says whether memory is bounded, since the
first half holds the one-time warm-up (imports, caches, the allocator's arenas) and the end the listings of every
job the settling polls make. On PostgreSQL the state is on a throwaway server the benchmark starts
(tests/postgres_server.py), with the shared storage a broker on a server needs (a temp folder); the smoke run is
a few seconds on each.
`bench_daemon_open_jobs.py` times reconcile passes over 1,000 open jobs.
Run: python tests/benchmarks/bench_daemon.py [--rate N] [--seconds S] [--database sqlite|postgresql|both]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parent.parent))
from _common import print_figures  # noqa: E402

DATABASES = ("sqlite", "postgresql")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _call(address: str, token: str, method: str, path: str, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(address + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


def _started(home: Path, database: dict[str, str]) -> tuple[subprocess.Popen, str, str]:
    env = {**os.environ, "TRAINMASTER_HOME": str(home), **database}
    daemon = subprocess.Popen([sys.executable, "-m", "trainmaster.broker.daemon", "--interval", "0.5"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = home / "daemon" / "state.json"
    deadline = time.monotonic() + 60
    while not state.exists():
        if time.monotonic() > deadline or daemon.poll() is not None:
            daemon.kill()
            raise RuntimeError("the daemon did not start")
        time.sleep(0.1)
    return daemon, json.loads(state.read_text())["address"], (home / "daemon" / "token").read_text().strip()


def _job(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text("import os, pathlib\n"
                                   "pathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'r.json').write_text('{}')\n")
    (root / "job.yaml").write_text("name: tiny\nentrypoint: python train.py\n")
    return root / "job.yaml"


def run(smoke: bool = False, rate: float = 2.0, seconds: float = 60.0,
        databases: tuple[str, ...] = DATABASES) -> dict[str, float]:
    rate, seconds = (1.0, 3.0) if smoke else (rate, seconds)
    figures: dict[str, float] = {}
    for database in databases:
        measured = _on(database, rate, seconds, settle_s=30 if smoke else 120)
        print_figures(f"daemon soak ({'SQLite' if database == 'sqlite' else 'PostgreSQL'})", measured)
        figures.update({(name if database == "sqlite" else f"{database}_{name}"): v for name, v in measured.items()})
    return figures


def _on(database: str, rate: float, seconds: float, *, settle_s: float) -> dict[str, float]:
    """The soak with the state on `database`: in the temp home (SQLite), or on a throwaway server."""
    from postgres_server import PostgresServer

    with tempfile.TemporaryDirectory() as tmp:
        if database == "sqlite":
            return _soak(Path(tmp), {}, rate, seconds, settle_s)
        (Path(tmp) / "shared").mkdir()
        server = PostgresServer().start()
        try:
            settings = {"TRAINMASTER_DATABASE_URL": server.database(), "TRAINMASTER_SHARED_STORAGE": f"{tmp}/shared"}
            return _soak(Path(tmp), settings, rate, seconds, settle_s)
        finally:
            server.stop()


def _soak(tmp: Path, database: dict[str, str], rate: float, seconds: float, settle_s: float) -> dict[str, float]:
    home, spec = tmp / "home", _job(tmp / "code")
    daemon, address, token = _started(home, database)
    latencies, rss, ids = [], [], []
    try:
        begin = time.monotonic()
        for n in range(int(rate * seconds)):
            time.sleep(max(0.0, begin + n / rate - time.monotonic()))
            sent = time.perf_counter()
            ids.append(_call(address, token, "POST", "/v1/jobs", {"spec": str(spec)})["id"])
            latencies.append(time.perf_counter() - sent)
            rss.append((time.monotonic() - begin, _rss_mib(daemon.pid), n + 1))
            if n % max(1, int(rate * 5)) == 0:
                print(f"  t={rss[-1][0]:5.1f} s  rss={rss[-1][1]:.1f} MiB  submitted={n + 1}")
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            jobs = _call(address, token, "GET", "/v1/jobs?all=1&limit=0")
            if all(j["state"] in ("accepted", "failed", "cancelled") for j in jobs):
                break
            time.sleep(0.5)
        rss.append((time.monotonic() - begin, _rss_mib(daemon.pid), len(ids)))
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
    latencies.sort()
    return {
        "submissions": float(len(ids)),
        "rate_per_s": rate,
        "submit_p50_s": latencies[len(latencies) // 2],
        "submit_p99_s": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "accepted": float(sum(j["state"] == "accepted" for j in jobs)),
        "failed": float(sum(j["state"] == "failed" for j in jobs)),
        "rss_start_mib": rss[0][1],
        "rss_after_30s_mib": next(m for t, m, _ in rss if t >= min(30.0, seconds / 2)),
        "rss_end_mib": rss[-1][1],
        "rss_max_mib": max(m for _, m, _ in rss),
        "rss_growth_per_100_jobs_second_half_mib": _growth_per_100(rss, seconds),
    }


def _growth_per_100(rss: list[tuple[float, float, int]], seconds: float) -> float:
    """MiB of RSS per 100 jobs submitted, from the first sample past half the run to the last one taken while
    submitting (one per submission; the end sample, after the settling polls, is left out)."""
    during = rss[:-1]
    start = next((s for s in during if s[0] >= seconds / 2), during[-1])
    return (during[-1][1] - start[1]) / max(1, during[-1][2] - start[2]) * 100


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--database", choices=[*DATABASES, "both"], default="both")
    args = parser.parse_args()
    run(rate=args.rate, seconds=args.seconds, databases=DATABASES if args.database == "both" else (args.database,))
