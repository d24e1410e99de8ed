"""The cores this process may run on: its CPU affinity (a container's or a `taskset`'s share), not the host's count,
which `os.cpu_count()` gives inside a container too."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """How many cores this process may run on (at least 1)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1
