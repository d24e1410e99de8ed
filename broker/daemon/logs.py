"""The daemon's log: rotated by size, and repeated errors rate-limited, so no client and no outage fills the disk.

Detached, the daemon writes `<home>/daemon/daemon.log` through a `RotatingFileHandler` (`MAX_BYTES` a file,
`BACKUPS` old files kept: at most 60 MiB in all); in the foreground (systemd, a container) it writes to stderr,
which the supervisor rotates. Either way a `RepeatFilter` lets through at most `BURST` records of one kind (the
same logger, level, message template and exception type) per `WINDOW_S` seconds; the next one let through says
how many were left out. A database that is away for an hour, or a flood of bad requests, costs a few lines a
minute, not a traceback per attempt.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
import threading
import time
from pathlib import Path

MAX_BYTES = 10 * 1024 * 1024
BACKUPS = 5
WINDOW_S = 60.0
BURST = 5
FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class RepeatFilter(logging.Filter):
    """At most `burst` records of one kind per `window_s`; the first let through after a pause counts the rest."""

    def __init__(self, window_s: float = WINDOW_S, burst: int = BURST, clock=time.monotonic):
        super().__init__()
        self.window_s, self.burst, self.clock = window_s, burst, clock
        self._seen: dict[tuple, list] = {}  # kind -> [window start, let through, left out]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, record.levelno, str(record.msg)[:200],
                record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else None)
        now = self.clock()
        with self._lock:
            if len(self._seen) > 10_000:  # kinds are templates, so few; bounded whatever happens
                self._seen.clear()
            window = self._seen.get(kind)
            if window is None or now - window[0] >= self.window_s:
                left_out = window[2] if window else 0
                self._seen[kind] = [now, 1, 0]
                if left_out:
                    record.msg = f"{record.msg} (and {left_out} more like it left out of the log in the last " \
                                 f"{self.window_s:.0f} s)"
                return True
            if window[1] < self.burst:
                window[1] += 1
                return True
            window[2] += 1
            return False


def setup(log_file: Path | None) -> logging.Handler:
    """The root logger at INFO through a rotating file (`log_file`) or stderr, rate-limited; its handler."""
    if log_file is not None:
        log_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        handler: logging.Handler = logging.handlers.RotatingFileHandler(log_file, maxBytes=MAX_BYTES,
                                                                        backupCount=BACKUPS, encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(RepeatFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    return handler
