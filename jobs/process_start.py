"""When a process started, measured from the machine's boot: the one start time no change of the wall clock moves.

psutil's `create_time` on Linux is the start since boot plus the boot time that `/proc/stat` gives, and that boot
time is derived from the wall clock: it moves by whole seconds whenever the clock is stepped (NTP, a laptop or a VM
resumed). A process recorded by its `create_time` can then look like another process given its pid. Whoever tells a
recorded process from a later one under the same pid (the local backend's supervisor, the daemon's run files)
records this too and compares it exactly.
"""

from __future__ import annotations

import os
from pathlib import Path


def started_since_boot(pid: int) -> float | None:
    """Seconds from the machine's boot to the process's start (Linux: /proc/PID/stat's starttime); None where /proc
    has no such process (gone, or not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        return int(stat[stat.rindex(b")") + 2:].split()[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def same_start(recorded: float, now: float) -> bool:
    """Whether two readings of `started_since_boot` are of one process (they are whole clock ticks)."""
    return abs(now - recorded) < 0.001
