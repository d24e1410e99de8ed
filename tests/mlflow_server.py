"""A real MLflow tracking server for the promotion tests: `mlflow server` (the venv's script, full mlflow) on a
SQLite backend and a local artifact store in a temp dir, on a free port of 127.0.0.1, stopped by its pid."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

START_TIMEOUT_S = 180  # full mlflow imports slowly on a loaded machine
JOB_EXECUTION = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"
"""Off: MLflow 3's server otherwise starts a job runner and seven Huey consumer processes (its GenAI jobs, which the
registry never uses), each importing all of mlflow: ~30 CPU-seconds of a 2-core machine per server, for nothing."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(root: Path) -> tuple[subprocess.Popen, str]:
    """Start the server; (its process, its URI) once `/health` answers. Fails (never skips) without mlflow."""
    script = Path(sys.executable).with_name("mlflow")
    assert script.exists(), f"the `mlflow` script is not beside {sys.executable}: install mlflow (the test server)"
    port = free_port()
    log = (root / "server.log").open("wb")
    process = subprocess.Popen(
        [str(script), "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
         "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True,
        env={**os.environ, "MLFLOW_TRACKING_URI": "", JOB_EXECUTION: "false"})
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, (root / "server.log").read_text()[-3000:]
        try:
            with urllib.request.urlopen(uri + "/health", timeout=2) as answer:
                if answer.status == 200:
                    return process, uri
        except OSError:
            time.sleep(0.5)
    stop(process)
    raise AssertionError(f"mlflow server did not answer on {uri} within {START_TIMEOUT_S} s")


def stop(process: subprocess.Popen) -> None:
    """Stop the server and its workers (its own process group, which it leads)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
