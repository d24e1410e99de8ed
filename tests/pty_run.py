"""Run the real `trainmaster` CLI in a pseudo-terminal of a given size, as a person at a terminal sees it.

The child's stdin, stdout and stderr are the pty's slave end, its window size set with TIOCSWINSZ (no COLUMNS in
its environment), so Rich detects a terminal and its width as it does for a user. Returns the exit code and
everything written, with the terminal's escapes (colours) removed and line ends made `\\n`.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\x1b[()][A-Z0-9]")


@dataclass
class Shown:
    code: int
    text: str

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()

    def widest(self) -> int:
        from rich.cells import cell_len

        return max((cell_len(line) for line in self.lines), default=0)


def in_terminal(*args: str, home, columns: int = 80, rows: int = 50, timeout: float = 300,
                extra_env: dict | None = None, argv: list[str] | None = None) -> Shown:
    """`trainmaster ARGS` (or `argv` + ARGS) on a pty of `columns` × `rows`."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR")}
    env.update({"TRAINMASTER_HOME": str(home), "TERM": "xterm-256color", **(extra_env or {})})
    command = (argv or [sys.executable, "-m", "trainmaster.broker.cli"]) + list(args)
    proc = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed its end
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
        code = proc.wait(timeout=30)
    finally:
        os.close(master)
    text = ANSI.sub("", out.decode(errors="replace")).replace("\r\n", "\n").replace("\r", "\n")
    return Shown(code=code, text=text)
