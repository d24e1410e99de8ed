"""A real Ray cluster on this machine for the Ray backend's tests: a head node (2 CPUs, the dashboard and its Jobs
API on 127.0.0.1) and a second node (1 CPU, without a log monitor of its own: one per host), each a `ray start
--block` process in a session of its own, every port chosen free, everything under one temp dir. (Ray registers
both nodes under this host's own interface address, whatever `--node-ip-address 127.0.0.1` says: its traffic still
never leaves the machine.) Stopped by what it started: the two `ray start` processes, every process below them and
every process naming the temp dir (never `ray stop`, which stops every Ray on the machine); then the temp dir is
removed (by a process of its own, never waited for: `remove_in_background`).
A missing `ray` fails the test: it is in the dev extra. The tests share one cluster per test process (`shared`,
the `ray_cluster` fixture of tests/conftest.py, which stops it after the last test of its group).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

START_S = 180.0  # a bound only: a loaded machine (the suite on 2 cores) may take past 90 s
IDLE_S = 30.0
CPUS = 3  # the head's 2 and the second node's 1
STOP_GRACE_S = 10.0
START_TRIES = 2
"""A node's `ray start` gives up when its raylet has not registered within Ray's own 30 s (not configurable), which
a loaded machine can exceed: the cluster is started again once."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayCluster:
    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="tmray-"))  # short: Ray's socket paths must fit 107 bytes
        self.storage = self.root / "storage"
        self.storage.mkdir()
        self.gcs_port, self.dashboard_port = free_port(), free_port()
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        self.starts: list[subprocess.Popen] = []

    def start(self) -> RayCluster:
        ray = Path(sys.executable).with_name("ray")
        if not ray.exists():
            raise RuntimeError(f"ray is not installed beside {sys.executable} (pip install 'trainmaster[ray]')")
        head = ["--head", "--num-cpus", "2", "--port", str(self.gcs_port), "--dashboard-host", "127.0.0.1",
                "--dashboard-port", str(self.dashboard_port), "--include-dashboard", "true",
                "--ray-client-server-port", str(free_port()), "--temp-dir", str(self.root / "t")]
        # one log monitor per host, as Ray's `--include-log-monitor` asks ("to avoid log duplication on the driver
        # process"): both nodes keep their logs in the same session folder on this machine, and each node's monitor
        # polled all of them, every line sent twice (~17 CPU-s apiece over the Ray tests, by process accounting)
        worker = ["--address", f"127.0.0.1:{self.gcs_port}", "--num-cpus", str(CPUS - 2),
                  "--include-log-monitor", "false"]
        for args in (head, worker):
            node = ["--node-ip-address", "127.0.0.1", "--disable-usage-stats", "--block",
                    "--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
                    "--runtime-env-agent-port", str(free_port()), "--metrics-export-port", str(free_port())]
            with open(self.root / f"start-{len(self.starts)}.log", "ab") as log:
                self.starts.append(subprocess.Popen([str(ray), "start", *args, *node], env=self.environment(),
                                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                    start_new_session=True))
            self.wait_for_nodes(len(self.starts))
        return self

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINMASTER_")}
        return {**env, "RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}"}

    def wait_for_nodes(self, count: int) -> None:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.starts):
                raise RuntimeError(f"ray start exited: {self.log()}")
            if len(self.alive_nodes()) >= count:
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Ray cluster did not have {count} node(s) within {START_S:.0f} s: {self.log()}")

    def wait_idle(self) -> None:
        """Until the usage report shows every CPU free (the head's monitor refreshes it every few seconds: a job
        that just ended may still be counted), so offers are the whole cluster's."""
        from trainmaster.backends.ray.cluster import nodes

        deadline = time.monotonic() + IDLE_S
        while sum(n.cpus for n in asyncio.run(nodes(self.address, 5))) < CPUS:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Ray cluster still has CPUs held after {IDLE_S:.0f} s")
            time.sleep(0.5)

    def alive_nodes(self) -> list[dict]:
        try:
            with urllib.request.urlopen(self.address + "/api/v0/nodes?limit=100", timeout=5) as resp:
                listed = json.loads(resp.read())["data"]["result"]["result"]
        except (OSError, ValueError, KeyError):
            return []
        return [n for n in listed if n["state"] == "ALIVE"]

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-2000:] for p in sorted(self.root.glob("start-*.log")))

    def processes(self) -> list[psutil.Process]:
        """Every process this cluster started: below the `ray start` processes, or naming its temp dir."""
        found = {}
        for start in self.starts:
            try:
                proc = psutil.Process(start.pid)
                found.update({p.pid: p for p in [proc, *proc.children(recursive=True)]})
            except psutil.NoSuchProcess:
                continue
        for proc in psutil.process_iter(["cmdline"]):
            if any(str(self.root) in part for part in proc.info["cmdline"] or []):
                found.setdefault(proc.pid, proc)
                try:
                    found.update({p.pid: p for p in proc.children(recursive=True)})
                except psutil.NoSuchProcess:
                    continue
        return list(found.values())

    def stop(self) -> None:
        procs = self.processes()
        for start in self.starts:
            if start.poll() is None:
                start.send_signal(signal.SIGTERM)  # `ray start --block` stops its node's processes
        psutil.wait_procs(procs, timeout=STOP_GRACE_S)
        for proc in procs:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                continue
        for start in self.starts:
            start.wait(timeout=STOP_GRACE_S)
        remove_in_background(self.root)


def remove_in_background(folder: Path) -> None:
    """`rm -rf folder` in a session of its own, never waited for. A requirements job's virtualenv under the cluster's
    folder is a copy of this venv (Ray's pip environment clones the virtualenv its node runs in): GBs, which a
    loaded CI machine was still removing when the last test's time limit ran out (pytest-timeout's 300 s counts
    the teardown that stops the shared cluster)."""
    subprocess.Popen(["rm", "-rf", "--", str(folder)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)


_shared: RayCluster | None = None


def shared() -> RayCluster:
    """The cluster this test process shares, started on first use; `stop_shared` stops it."""
    global _shared
    for tries in range(START_TRIES, 0, -1):
        if _shared is not None:
            break
        cluster = RayCluster()
        try:
            _shared = cluster.start()
        except BaseException as exc:
            cluster.stop()
            if tries == 1 or not isinstance(exc, RuntimeError):
                raise
    return _shared


def stop_shared() -> None:
    global _shared
    if _shared is not None:
        cluster, _shared = _shared, None
        cluster.stop()
