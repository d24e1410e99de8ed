"""A progress bar for long transfers (outputs fetched, openings streamed, a bundle uploaded): drawn on stderr, only on a
terminal and only for transfers large enough to be worth one, so `--json` output and logs stay clean."""

from __future__ import annotations

import sys
import threading

MIN_BYTES = 8 * 2**20


class TransferBar:
    """The `progress(done, total)` callback the broker hands to backends' transfers."""

    def __init__(self, label: str = "fetching", stream=None):
        self.label = label
        self.stream = stream or sys.stderr
        self._bar = None
        self._task = None
        self._lock = threading.Lock()  # transfers report from worker threads

    def __call__(self, done: int, total: int | None) -> None:
        if total is None or total < MIN_BYTES or not self.stream.isatty():
            return
        with self._lock:
            if self._bar is None:
                from rich.console import Console
                from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

                self._bar = Progress(self.label, BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                                     console=Console(file=self.stream), transient=True)
                self._bar.start()
                self._task = self._bar.add_task(self.label, total=total)
            self._bar.update(self._task, completed=done, total=total)
            if done >= total:
                self._bar.stop()
                self._bar = None
