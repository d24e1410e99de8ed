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
