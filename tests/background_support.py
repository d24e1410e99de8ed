"""The background pass a read starts (broker/cli/background.py), seen from the tests: stop the one a test left
running on its home (by the pid it wrote into its lock), and poll a read until the pass has moved the state."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def stop_background(home: Path, timeout: float = 10.0) -> None:
    """Stop the background pass running on `home`, if any, and wait until its lock is free."""
    from trainmaster.broker.cli.background_start import holder, running

    if not (Path(home) / "background.lock").exists():
        return
    pid = holder(home)
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while running(home) and time.monotonic() < deadline:
        time.sleep(0.05)
    if running(home):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stop_all_under(root: Path) -> None:
    """Stop every background pass whose home lies under `root` (the session's temporary folders)."""
    for lock in Path(root).rglob("background.lock"):
        stop_background(lock.parent)


def polled(read, done, timeout: float = 120.0, every: float = 0.5):
    """`read()` again (each a user's read, each starting the background pass if none runs) until `done(value)`
    or `timeout` seconds; the last value read."""
    deadline = time.monotonic() + timeout
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(every)
        value = read()
    return value

