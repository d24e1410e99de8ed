"""Run the real `trainmaster` CLI in a subprocess on a given home (the helper the hostile-input tests share)."""

from __future__ import annotations

import os
import subprocess
import sys


def tm(*args: str, home, timeout: float = 280, extra_env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """`python -m trainmaster.broker.cli ARGS` with `TRAINMASTER_HOME=home`; text output, never raises on exit codes.
    The timeout is a bound only, under the suite's 300 s a test (a call takes seconds; CI's runner once stalled every
    process for 1-2 minutes, and 120 s failed a test that takes 1.4 s)."""
    env = {**os.environ, "TRAINMASTER_HOME": str(home), "COLUMNS": "200", **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=cwd)
