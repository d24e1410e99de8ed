"""When a process started, measured from the machine's boot: the one start time no change of the wall clock moves.

psutil's `create_time` on Linux is the start since boot plus the boot time that `/proc/stat` gives, and that boot
time is derived from the wall clock: it moves by whole seconds whenever the clock is stepped (NTP, a laptop or a VM
resumed). A process recorded by its `create_time` can then look like another process given its pid. Whoever tells a
recorded process from a later one under the same pid (the local backend's supervisor, the daemon's run files)
records this too and compares it exactly.

A start since boot names a process within one boot only: after a reboot the same pid may start at the same tick
again (a service started early in every boot). So it is recorded with the boot's id (`boot_id`, new at every boot),
and a record of another boot names no live process (`this_boot`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def started_since_boot(pid: int) -> float | None:
    """Seconds from the machine's boot to the process's start (Linux: /proc/PID/stat's starttime); None where /proc
    has no such process (gone, or not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        return int(stat[stat.rindex(b")") + 2:].split()[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def now_since_boot() -> float | None:
    """Seconds since the machine's boot now, on the clock `started_since_boot` reads (Linux's CLOCK_BOOTTIME, which
    counts a suspend too); None where there is none (macOS)."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    return None if clock is None else time.clock_gettime(clock)


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str | None:
    """This boot's id (Linux: a random UUID the kernel draws at every boot); None where there is none (macOS)."""
    try:
        return BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def this_boot(recorded: str | None) -> bool:
    """Whether a record that gave `recorded` as its `boot_id` was written in the current boot (True where either is
    unknown: a record of an older version, or no boot id to read)."""
    now = boot_id() if recorded is not None else None
    return recorded is None or now is None or now == recorded


def same_start(recorded: float, now: float) -> bool:
    """Whether two readings of `started_since_boot` are of one process (they are whole clock ticks)."""
    return abs(now - recorded) < 0.001
