"""The process pool the verification pipeline (with its replay audit) runs in, off the broker's event loop.

One pool per process, shared by every Broker in it (the daemon's workers, a command's one): created on the first
verification, shut down with the daemon or the command (`shutdown`). Its workers are started with `spawn`, never
forked from a process holding threads and an event loop. It holds `TRAINMASTER_AUDIT_PROCESSES` workers, by
default as many as the CPUs up to `DEFAULT_MAX`; verifications beyond that wait their turn.

A worker that dies (killed for memory, a crash in native code) breaks the pool: that is our failure, never the
executor's. The verification is run again on a fresh pool, at most `TRIES` times in all; `PoolDied` then tells
the caller, which leaves the attempt unverified. A `kill -9` of the broker takes its workers along.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

PROCESSES_ENV = "TRAINMASTER_AUDIT_PROCESSES"
DEFAULT_MAX = 2
TRIES = 3
PR_SET_PDEATHSIG = 1

T = TypeVar("T")


class PoolDied(RuntimeError):
    """Every try of a call lost its worker process (each time on a fresh pool)."""


def size() -> int:
    """The pool's worker count: `TRAINMASTER_AUDIT_PROCESSES`, else the CPU count up to DEFAULT_MAX."""
    given = os.environ.get(PROCESSES_ENV, "").strip()
    if given:
        try:
            wanted = int(given)
        except ValueError:
            raise ValueError(f"{PROCESSES_ENV}={given!r}: expected a whole number of processes") from None
        if wanted < 1:
            raise ValueError(f"{PROCESSES_ENV}={given!r}: at least 1 process is needed")
        return wanted
    return max(1, min(DEFAULT_MAX, os.cpu_count() or 1))


class AuditPool:
    """A lazily started process pool whose broken instances are replaced (see the module's docstring)."""

    def __init__(self) -> None:
        self._executor: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a worker process (both picklable, and its result); retried on a fresh pool when its
        worker died, `PoolDied` after TRIES such deaths."""
        loop = asyncio.get_running_loop()
        for _ in range(TRIES):
            executor = self._current()
            try:
                return await loop.run_in_executor(executor, fn, *args)
            except BrokenProcessPool:
                self._replace(executor)
        raise PoolDied(f"the verification process died {TRIES} times (each on a fresh process pool)")

    def shutdown(self) -> None:
        """Stop the workers (a later call starts a new pool)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)

    def _current(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ProcessPoolExecutor(size(), mp_context=multiprocessing.get_context("spawn"),
                                                     initializer=_die_with_broker, initargs=(os.getpid(),))
            return self._executor

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        """Drop the broken pool (once, however many calls saw it break); the next call starts a fresh one."""
        with self._lock:
            if self._executor is broken:
                self._executor = None
        broken.shutdown(wait=False, cancel_futures=True)


def _die_with_broker(broker_pid: int) -> None:
    """In each worker, first: a `kill -9` of the broker takes its workers along (Linux's parent-death signal),
    so no orphaned verification records a verdict beside the one the next broker runs again."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != broker_pid:  # the broker died before the signal was asked for
        os._exit(1)


shared = AuditPool()
"""The process's pool."""


def shutdown() -> None:
    """Stop the process's pool: the daemon when it stops, a command when its event loop ends."""
    shared.shutdown()
