"""Waiting for a local attempt's end as the local backend defines it (backends/local/backend.py `_status`): its end
recorded in `exit.json` and its supervisor, which then stops what the job left running and exits, gone. A test
that waited for `exit.json` alone could read the attempt while the supervisor still cleaned up (it is `running`)."""

from __future__ import annotations

import time
from pathlib import Path

from trainmaster.backends.local.backend import _status


def wait_ended(workdir: Path, timeout: float = 60.0) -> None:
    """Until the backend's own status of the attempt in `workdir` is an end (asked only once `exit.json` exists, so
    the wait never reaps an attempt itself: that stays the broker's)."""
    deadline = time.time() + timeout
    while not ((workdir / "exit.json").exists() and _status(workdir).phase.done):
        assert time.time() < deadline, f"the attempt in {workdir} did not end within {timeout:.0f} s"
        time.sleep(0.05)
