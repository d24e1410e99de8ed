"""Whether the kernel's out-of-memory killer struck: the supervisor's cgroup counts its kills.

cgroup v2 keeps `oom_kill N` in `memory.events` of each cgroup; the supervisor reads the count when
it starts and again when the job ends, so a job killed by SIGKILL while the count rose is reported
as killed for its memory rather than as a bare signal. Where the file cannot be read (cgroup v1,
macOS) the count is None and the end is reported as a SIGKILL from an unknown sender.
"""

from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
KILLED = (-9, 137)
"""How a job killed by SIGKILL exits: -9 from Popen, 128 + 9 through a shell or a launcher."""


def kills() -> int | None:
    """The OOM kills counted so far in this process's cgroup (None when it cannot be read)."""
    try:
        line = Path("/proc/self/cgroup").read_text().splitlines()[0]
        events = CGROUP_ROOT / line.partition("::")[2].lstrip("/") / "memory.events"
        counts = dict(row.split() for row in events.read_text().splitlines())
        return int(counts["oom_kill"])
    except (OSError, IndexError, KeyError, ValueError):
        return None


def killed_for_memory(exit_code: int | None, before: int | None, after: int | None) -> bool | None:
    """Whether a job that ended with `exit_code` was killed by the OOM killer: None when it was
    killed by SIGKILL but the counts cannot tell by whom."""
    if exit_code not in KILLED:
        return False
    if before is None or after is None:
        return None
    return after > before
