"""Whether the kernel's out-of-memory killer struck: the supervisor's cgroup counts its kills.

The kernel keeps `oom_kill N` per memory cgroup (v2: `memory.events`; v1: `memory.oom_control`);
the supervisor reads the count when it starts and again when the job ends, so a job killed by
SIGKILL while the count rose is reported as killed for its memory rather than as a bare signal.
Where no count can be read (macOS, an old kernel) it is None and the end is reported as a SIGKILL
from an unknown sender.
"""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
KILLED = (-9, 137)
"""How a job killed by SIGKILL exits: -9 from Popen, 128 + 9 through a shell or a launcher."""


def kills(proc: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> int | None:
    """The OOM kills counted so far in this process's memory cgroup (None when it cannot be read)."""
    for events in _counters(proc, root):
        try:
            counts = dict(row.split() for row in events.read_text().splitlines())
            return int(counts["oom_kill"])
        except (OSError, KeyError, ValueError):
            continue
    return None


def _counters(proc: Path, root: Path) -> list[Path]:
    """Where the count may be: cgroup v2's `memory.events`, v1's `memory.oom_control` (kernel 4.13 on),
    each in this process's own cgroup, then at the mount's root (a container sees its own cgroup there)."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            found += [root / path.lstrip("/") / "memory.events", root / "memory.events"]
        elif "memory" in controllers.split(","):
            found += [root / "memory" / path.lstrip("/") / "memory.oom_control", root / "memory" / "memory.oom_control"]
    return found


def killed_for_memory(exit_code: int | None, before: int | None, after: int | None) -> bool | None:
    """Whether a job that ended with `exit_code` was killed by the OOM killer: None when it was
    killed by SIGKILL but the counts cannot tell by whom."""
    if exit_code not in KILLED:
        return False
    if before is None or after is None:
        return None
    return after > before
