"""The daemon as a server under abuse and outages: `/v1/health` latency (p50/p99) and jobs reconciled per minute
while 1,000 idle connections are held open, and while its PostgreSQL server restarts once a minute; and its
resident memory over a long soak of small jobs (2,000 by default).

A real daemon (`python -m trainmaster.broker.daemon`, as `daemon start` runs it) on 127.0.0.1 in a temp home; each
job is a one-line job on the local backend, submitted through the API at `--rate` per second, so the reconciler
advances them to `accepted` while more arrive. "Reconciled per minute" is the jobs that reached `accepted` in the
window, per minute of it.

- idle: the first third of the window without idle connections (the baseline), the rest with `--idle` connections
  held open (those the daemon closes as idle to make room are opened again every second, so the pressure stays).
  The health p99 ratio (idle / baseline) is the figure a noisy machine keeps comparable.
- restarts: the state on a throwaway PostgreSQL server (tests/postgres_server.py, with the shared storage a broker
  on a server needs), restarted (`pg_ctl restart -m fast`) every `--restart-every` seconds; also counted: jobs
  failed, and jobs with more than one charge (doubled: must be 0).
- soak: `--soak-jobs` jobs at `--rate` per second on SQLite; the RSS at the start, at half, at the end, and its
  growth per 100 jobs over the second half.

Run: python tests/benchmarks/bench_daemon_server.py [--minutes M] [--idle N] [--rate R] [--restart-every S]
     [--soak-jobs N] [--phase idle|restarts|soak|all]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parent.parent))
from _common import print_figures  # noqa: E402

PHASES = ("idle", "restarts", "soak")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _call(address: str, token: str, method: str, path: str, body: dict | None = None, timeout: float = 60):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(address + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return json.loads(r.read())


def _started(home: Path, settings: dict[str, str]) -> tuple[subprocess.Popen, str, str]:
    env = {**os.environ, "TRAINMASTER_HOME": str(home), **settings}
    daemon = subprocess.Popen([sys.executable, "-m", "trainmaster.broker.daemon", "--interval", "0.5", "--log-file",
                               str(home / "daemon" / "daemon.log")], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    state = home / "daemon" / "state.json"
    deadline = time.monotonic() + 120
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


class Feeder(threading.Thread):
    """Submits the job at `rate` per second through the API until stopped (a refused submit, the database away,
    is counted and the next one tried)."""

    def __init__(self, address: str, token: str, spec: Path, rate: float, limit: int | None = None):
        super().__init__(daemon=True)
        self.address, self.token, self.spec, self.rate, self.limit = address, token, spec, rate, limit
        self.ids: list[str] = []
        self.refused = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        begin = time.monotonic()
        n = 0
        while not self.stopping.is_set() and (self.limit is None or len(self.ids) < self.limit):
            time.sleep(max(0.0, begin + n / self.rate - time.monotonic()))
            n += 1
            try:
                self.ids.append(_call(self.address, self.token, "POST", "/v1/jobs", {"spec": str(self.spec)})["id"])
            except OSError:
                self.refused += 1


class HealthProbe(threading.Thread):
    """`/v1/health` every `every` seconds on a new connection; its latencies (a failure counts as `timeout`)."""

    def __init__(self, address: str, token: str, every: float = 0.25, timeout: float = 10.0):
        super().__init__(daemon=True)
        self.address, self.token, self.every, self.timeout = address, token, every, timeout
        self.samples: list[tuple[float, float]] = []
        self.failures = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            sent = time.perf_counter()
            try:
                _call(self.address, self.token, "GET", "/v1/health", timeout=self.timeout)
                self.samples.append((time.monotonic(), time.perf_counter() - sent))
            except OSError:
                self.failures += 1
                self.samples.append((time.monotonic(), self.timeout))
            self.stopping.wait(self.every)

    def percentile(self, q: float, since: float = 0.0, until: float = float("inf")) -> float:
        chosen = sorted(s for t, s in self.samples if since <= t < until)
        return chosen[min(len(chosen) - 1, int(len(chosen) * q))] if chosen else float("nan")


class IdleHolder(threading.Thread):
    """Holds `count` idle TCP connections open to the daemon (no request, no token), opening again every second
    those the daemon closed."""

    def __init__(self, address: str, count: int):
        super().__init__(daemon=True)
        host, port = address.removeprefix("http://").split(":")
        self.target, self.count = (host, int(port)), count
        self.sockets: list[socket.socket] = []
        self.reopened = 0
        self.held: list[int] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            alive = []
            for s in self.sockets:
                try:
                    s.setblocking(False)
                    gone = s.recv(1) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    s.close()
                else:
                    alive.append(s)
            self.sockets = alive
            self.held.append(len(alive))
            while len(self.sockets) < self.count and not self.stopping.is_set():
                try:
                    self.sockets.append(socket.create_connection(self.target, timeout=2))
                    self.reopened += 1
                except OSError:
                    break
            self.stopping.wait(1.0)
        for s in self.sockets:
            s.close()


def _accepted_times(where) -> list[float]:
    """When each job was accepted (its `accepted` transition), read from the state database."""
    from trainmaster.storage import statedb

    db = statedb.connect(where)
    try:
        return [at for (at,) in db.execute("SELECT at FROM events WHERE kind = 'transition' AND to_state = 'accepted'")
                .fetchall()]
    finally:
        db.close()


def _per_minute(times: list[float], since: float, until: float) -> float:
    """How many of `times` (wall clock) fall in [since, until), per minute of it."""
    return sum(since <= t < until for t in times) / max(1e-6, (until - since) / 60)


def _accepted_between(address: str, token: str, ids: list[str]) -> list[dict]:
    jobs = _call(address, token, "GET", "/v1/jobs?all=1&limit=0", timeout=120)
    wanted = set(ids)
    return [j for j in jobs if j["id"] in wanted]


def _stop(daemon: subprocess.Popen) -> None:
    daemon.send_signal(signal.SIGTERM)
    try:
        daemon.wait(timeout=90)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()


def idle_phase(minutes: float, idle: int, rate: float) -> dict[str, float]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, idle + 512)), hard))
    with tempfile.TemporaryDirectory() as tmp:
        home, spec = Path(tmp) / "home", _job(Path(tmp) / "code")
        daemon, address, token = _started(home, {})
        probe, feeder, holder = HealthProbe(address, token), Feeder(address, token, spec, rate), IdleHolder(address, idle)
        try:
            window = minutes * 60
            probe.start()
            feeder.start()
            begin, wall_begin = time.monotonic(), time.time()
            time.sleep(window / 3)
            baseline_end, wall_baseline_end = time.monotonic(), time.time()
            holder.start()
            time.sleep(window * 2 / 3)
            end, wall_end = time.monotonic(), time.time()
            feeder.stopping.set()
            probe.stopping.set()
            holder.stopping.set()
            feeder.join()
            probe.join()
            holder.join()
            health = _call(address, token, "GET", "/v1/health")
            jobs = {j["id"]: j for j in _accepted_between(address, token, feeder.ids)}
            log_bytes = sum(p.stat().st_size for p in (home / "daemon").glob("daemon.log*"))
        finally:
            _stop(daemon)
        accepted_at = _accepted_times(home / "state.db")
    accepted = [i for i in feeder.ids if jobs.get(i, {}).get("state") == "accepted"]
    return {
        "idle_connections": float(idle),
        "idle_held_median": float(sorted(holder.held)[len(holder.held) // 2]) if holder.held else 0.0,
        "idle_opened": float(holder.reopened),
        "connection_limit": float(health["connections"]["limit"]),
        "closed_idle_by_daemon": float(health["connections"]["closed_idle"]),
        "health_p50_baseline_s": probe.percentile(0.5, begin, baseline_end),
        "health_p99_baseline_s": probe.percentile(0.99, begin, baseline_end),
        "health_p50_idle_s": probe.percentile(0.5, baseline_end, end),
        "health_p99_idle_s": probe.percentile(0.99, baseline_end, end),
        "health_p99_ratio_idle_over_baseline": probe.percentile(0.99, baseline_end, end)
        / max(1e-6, probe.percentile(0.99, begin, baseline_end)),
        "health_failures": float(probe.failures),
        "submitted": float(len(feeder.ids)),
        "accepted_by_end": float(len(accepted)),
        "reconciled_per_min_baseline": _per_minute(accepted_at, wall_begin, wall_baseline_end),
        "reconciled_per_min_idle": _per_minute(accepted_at, wall_baseline_end, wall_end),
        "log_bytes": float(log_bytes),
    }


def restarts_phase(minutes: float, rate: float, restart_every_s: float) -> dict[str, float]:
    from postgres_server import PostgresServer
    from trainmaster.storage import statedb

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "shared").mkdir()
        server = PostgresServer().start()
        try:
            url = server.database()
            home, spec = Path(tmp) / "home", _job(Path(tmp) / "code")
            daemon, address, token = _started(home, {"TRAINMASTER_DATABASE_URL": url,
                                                     "TRAINMASTER_SHARED_STORAGE": f"{tmp}/shared"})
            probe, feeder = HealthProbe(address, token), Feeder(address, token, spec, rate)
            restarts = 0
            try:
                probe.start()
                feeder.start()
                begin, wall_begin = time.monotonic(), time.time()
                while time.monotonic() - begin < minutes * 60:
                    time.sleep(min(restart_every_s, max(0.0, minutes * 60 - (time.monotonic() - begin))))
                    if time.monotonic() - begin < minutes * 60:
                        server.restart()
                        restarts += 1
                end, wall_end = time.monotonic(), time.time()
                feeder.stopping.set()
                probe.stopping.set()
                feeder.join()
                probe.join()
                settle, listing_failures, jobs = time.monotonic() + 120, 0, []
                while time.monotonic() < settle:  # let the last submissions end, for the lost/doubled count
                    try:
                        jobs = _accepted_between(address, token, feeder.ids)
                    except OSError as exc:
                        listing_failures += 1
                        print(f"  listing the jobs failed: {exc}")
                        time.sleep(1)
                        continue
                    if all(j["state"] in ("accepted", "failed", "cancelled") for j in jobs):
                        break
                    time.sleep(1)
                alive = daemon.poll() is None
                if listing_failures:
                    print("  the daemon's log ends:\n" + (home / "daemon" / "daemon.log").read_text()[-4000:])
            finally:
                _stop(daemon)
            db = statedb.connect(url)
            try:
                charges = db.execute("SELECT job_id, count(*) FROM ledger_entries WHERE kind = 'charge'"
                                     " GROUP BY job_id").fetchall()
            finally:
                db.close()
            accepted_at = _accepted_times(url)
        finally:
            server.stop()
    return {
        "restarts": float(restarts),
        "restart_every_s": restart_every_s,
        "daemon_survived": float(alive),
        "health_p50_s": probe.percentile(0.5),
        "health_p99_s": probe.percentile(0.99),
        "health_failures": float(probe.failures),
        "submitted": float(len(feeder.ids)),
        "submits_refused_while_away": float(feeder.refused),
        "listing_failures_after": float(listing_failures),
        "accepted": float(sum(j["state"] == "accepted" for j in jobs)),
        "failed": float(sum(j["state"] == "failed" for j in jobs)),
        "doubled_charges": float(sum(1 for _, n in charges if n > 1)),
        "reconciled_per_min": _per_minute(accepted_at, wall_begin, wall_end),
    }


def soak_phase(jobs: int, rate: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        home, spec = Path(tmp) / "home", _job(Path(tmp) / "code")
        daemon, address, token = _started(home, {})
        feeder = Feeder(address, token, spec, rate, limit=jobs)
        rss: list[tuple[float, float, int]] = []
        try:
            begin = time.monotonic()
            feeder.start()
            while feeder.is_alive():
                rss.append((time.monotonic() - begin, _rss_mib(daemon.pid), len(feeder.ids)))
                if len(rss) % 30 == 1:
                    print(f"  t={rss[-1][0]:6.1f} s  rss={rss[-1][1]:.1f} MiB  submitted={rss[-1][2]}")
                time.sleep(1.0)
            settle = time.monotonic() + 300
            while time.monotonic() < settle:
                listed = _accepted_between(address, token, feeder.ids)
                if all(j["state"] in ("accepted", "failed", "cancelled") for j in listed):
                    break
                time.sleep(2)
            rss.append((time.monotonic() - begin, _rss_mib(daemon.pid), len(feeder.ids)))
        finally:
            _stop(daemon)
    during = rss[:-1] or rss
    half = next((s for s in during if s[2] >= jobs / 2), during[-1])
    return {
        "jobs": float(len(feeder.ids)),
        "accepted": float(sum(j["state"] == "accepted" for j in listed)),
        "rss_start_mib": rss[0][1],
        "rss_half_mib": half[1],
        "rss_last_submission_mib": during[-1][1],
        "rss_end_mib": rss[-1][1],
        "rss_max_mib": max(m for _, m, _ in rss),
        "rss_growth_per_100_jobs_second_half_mib": (during[-1][1] - half[1]) / max(1, during[-1][2] - half[2]) * 100,
    }


def run(smoke: bool = False, minutes: float = 3.0, idle: int = 1000, rate: float = 2.0, restart_every_s: float = 60.0,
        soak_jobs: int = 2000, phases: tuple[str, ...] = PHASES) -> dict[str, float]:
    if smoke:
        minutes, idle, rate, restart_every_s, soak_jobs = 0.1, 50, 2.0, 3.0, 4
    figures: dict[str, float] = {}
    if "idle" in phases:
        measured = idle_phase(minutes, idle, rate)
        print_figures(f"/v1/health and reconciling with {idle} idle connections held open", measured)
        figures.update({f"idle_{k}": v for k, v in measured.items()})
    if "restarts" in phases:
        measured = restarts_phase(minutes, rate, restart_every_s)
        print_figures(f"/v1/health and reconciling while PostgreSQL restarts every {restart_every_s:.0f} s", measured)
        figures.update({f"restarts_{k}": v for k, v in measured.items()})
    if "soak" in phases:
        measured = soak_phase(soak_jobs, rate)
        print_figures(f"daemon RSS over a {soak_jobs}-job soak (SQLite)", measured)
        figures.update({f"soak_{k}": v for k, v in measured.items()})
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=3.0, help="each of the idle and restarts windows")
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=2.0, help="jobs submitted per second")
    parser.add_argument("--restart-every", type=float, default=60.0)
    parser.add_argument("--soak-jobs", type=int, default=2000)
    parser.add_argument("--phase", choices=[*PHASES, "all"], default="all")
    args = parser.parse_args()
    run(minutes=args.minutes, idle=args.idle, rate=args.rate, restart_every_s=args.restart_every,
        soak_jobs=args.soak_jobs, phases=PHASES if args.phase == "all" else (args.phase,))
