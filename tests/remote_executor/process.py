"""The executor as a process of its own: started on a free port of 127.0.0.1 with its own TRAINMASTER_HOME,
killed the way a machine dies (`kill -9` of the server and every process it started, its detached
training supervisors included), and started again on the same home and port."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from process_tree import kill_tree
from remote_executor import protocol

TESTS = Path(__file__).resolve().parent.parent
START_S = 180.0  # a bound only: it starts in ~2 s; CI's runner once stalled every process for 1-2 min


class ExecutorProcess:
    def __init__(self, home: Path, port: int | None = None):
        self.home = home
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ExecutorProcess:
        """Start the server and wait until it answers `hello` with this protocol's version."""
        self.home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "TRAINMASTER_HOME": str(self.home),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
        env.pop(protocol.URL_ENV, None)
        with open(self.home / "server.log", "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "remote_executor.server", "--home", str(self.home),
                                          "--port", str(self.port)], env=env, cwd=self.home, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the executor exited with {self.proc.returncode}: {self._log_tail()}")
            try:
                with urllib.request.urlopen(self.url + protocol.HELLO, timeout=1) as r:
                    assert json.load(r)["protocol"] == protocol.VERSION
                    return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.05)
        raise RuntimeError(f"the executor did not answer within {START_S:.0f} s: {self._log_tail()}")

    def kill9(self) -> int:
        """SIGKILL to the server and every process it started; returns how many there were."""
        return kill_tree(self.proc)

    def stop(self) -> None:
        """Stop what is left of the executor (after a test)."""
        if self.proc is not None and self.proc.poll() is None:
            self.kill9()

    def _log_tail(self) -> str:
        log = self.home / "server.log"
        return log.read_text(errors="replace")[-2000:] if log.exists() else ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
