"""Waiting for a local attempt's end as the local backend defines it (backends/local/backend.py `_status`): its end
recorded in `exit.json` and its supervisor, which then stops what the job left running and exits, gone. A test
that waited for `exit.json` alone could read the attempt while the supervisor still cleaned up (it is `running`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from trainmaster.backends.local.backend import _alive


def wait_ended(workdir: Path, timeout: float = 60.0) -> None:
    deadline = time.time() + timeout
    while True:
        if (workdir / "exit.json").exists():
            started = json.loads((workdir / "supervisor.json").read_text())
            if not _alive(started["pid"], started["create_time"]):
                return
        assert time.time() < deadline, "the job did not finish"
        time.sleep(0.05)
