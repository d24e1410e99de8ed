"""Run the real `trainmaster` CLI with a pseudo-terminal as its stdin, stdout and stderr (pty.fork), reading what it
draws as it draws it: the live status line under a followed log, seen mid-run (tests/pty_run.py sizes the terminal
instead, for layout)."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def terminal_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE")}
    return {**env, "TRAINMASTER_HOME": str(home), "COLUMNS": "200", "TERM": "xterm-256color"}


def on_terminal(*args: str, home: Path, timeout: float = 240.0,
                 on_output: Callable[[str], None] = lambda shown: None,
                 cli: str = "trainmaster.broker.cli") -> tuple[int, str]:
    """`trainmaster ARGS` (the module `cli`) with a pseudo-terminal as stdin, stdout and stderr: its exit code
    and what it drew. `on_output` sees everything drawn so far (escapes removed) after each read."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: exec at once, never back into pytest
        try:
            os.execve(sys.executable, [sys.executable, "-m", cli, *args], terminal_env(home))
        finally:
            os._exit(127)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 1.0)[0]:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                out += data
                on_output(plain(out))
        else:
            os.kill(pid, signal.SIGKILL)
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), plain(out)


def plain(drawn: bytes) -> str:
    return ANSI.sub("", drawn.decode(errors="replace")).replace("\r", "\n")
