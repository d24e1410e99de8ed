"""Starting one attempt's keeper exactly once, whoever tries and however often a try dies half-way.

A launch is: extract the bundle, write `launch.json`, start the keeper (keeper.py), which starts the
supervisor. The process that launches may be killed anywhere in it (a CLI killed with kill -9, a
machine that stops), and the next process to bring the attempt up to date (the same dispatch resumed)
must then finish the launch rather than wait for a supervisor nobody started, and never start a second.

Two locks (flock: the kernel drops them when their holder dies, however it dies):

- `spawned`, held by the launching process for the length of its launch: launches of one attempt run one
  at a time, and one that finds the launch done (below) starts nothing;
- `keeper.lock`, taken by the keeper as it starts (a second keeper finds it held and exits at once) and
  handed on to the supervisor, so it stays held while either lives.

The launch is done when `supervisor.json` exists or `keeper.lock` is held. A launcher that died after
starting the keeper and before the keeper took its lock leaves a launch the next one repeats; of the two
keepers, only the first to lock runs a supervisor.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

from trainmaster.backends.local.keeper import KEEPER_LOCK

SPAWNED = "spawned"
SUPERVISOR = "supervisor.json"  # supervisor.SUPERVISOR (not imported: the keeper imports this module to start fast)
POLL_S = 0.01


def launched(workdir: Path) -> bool:
    """Whether a keeper was started for the attempt: its supervisor recorded itself, or the keeper's lock is held."""
    if (workdir / SUPERVISOR).exists():
        return True
    try:
        fd = os.open(workdir / KEEPER_LOCK, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock taken here
    return (workdir / SUPERVISOR).exists()


async def launch_once(workdir: Path, prepare: Callable[[], None], start: Callable[[], None], *,
                      timeout: float) -> bool:
    """Under the attempt's launch lock, `prepare()` (in a thread) and `start()` the keeper unless the launch is
    done already; returns whether this call started it. `timeout`: how long another launcher may hold the lock
    (it is preparing: extracting the bundle) before this gives up with TimeoutError."""
    fd = os.open(workdir / SPAWNED, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another process has been starting this attempt for over {timeout:.0f} s")
                await asyncio.sleep(POLL_S)
        if launched(workdir):
            return False
        await asyncio.to_thread(prepare)
        start()
        return True
    finally:
        os.close(fd)

