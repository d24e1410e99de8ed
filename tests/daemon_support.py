"""A real daemon for the tests: started through `trainmaster daemon start` on 127.0.0.1, stopped by its pid."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

from cli_run import tm


def start(home: Path, *extra: str) -> dict:
    """Start the daemon of `home` (detached, as a user would); its state file (pid, address)."""
    out = tm("daemon", "start", "--lease-s", "3", *extra, home=home, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads((home / "daemon" / "state.json").read_text())


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to the daemon we started, and wait until it is gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"daemon {pid} still runs")


def get(address: str, path: str, *, token: str | None = None, cookie: str | None = None) -> tuple[int, dict]:
    """(status, JSON) of a GET on the daemon's API with the given credentials."""
    headers = {**({"Authorization": f"Bearer {token}"} if token else {}),
               **({"Cookie": f"trainmaster_token={cookie}"} if cookie else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(address + path, headers=headers), timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def wait_for(predicate, timeout: float = 60, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := predicate():
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def token_of(home: Path) -> str:
    return (home / "daemon" / "token").read_text().strip()


def call(address: str, method: str, path: str, token: str, body: dict | None = None, *,
         headers: dict | None = None, timeout: float = 10) -> tuple[int, dict]:
    """(status, JSON) of a request to the daemon's API with the token (`Bearer`)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(address + path, data=data, method=method, headers={
        "Authorization": f"Bearer {token}", **({"Content-Type": "application/json"} if data else {}),
        **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def daemon_start(home: Path, *extra: str, extra_env: dict | None = None, cwd=None, nofile: int | None = None,
                 timeout: float = 120):
    """`trainmaster daemon start ARGS` as a user runs it (not asserting success); `nofile`: the open-file limit
    (soft and hard) the command, and so the daemon it detaches, runs under."""
    import subprocess
    import sys

    def limited() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    env = {**os.environ, "TRAINMASTER_HOME": str(home), "COLUMNS": "200", **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "daemon", "start", "--lease-s", "3", *extra],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd,
                          preexec_fn=limited if nofile else None)


def daemon_processes(home: Path) -> list[int]:
    """The pids of every daemon process running on `home` (found by their command line and environment)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "trainmaster.broker.daemon" in (proc.info["cmdline"] or []) and \
                    proc.environ().get("TRAINMASTER_HOME") == str(home) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found
