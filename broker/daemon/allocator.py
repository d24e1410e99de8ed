"""The daemon's C allocator kept to two malloc arenas (glibc), so its resident memory stays near what it uses.

glibc gives each new thread an arena of its own, up to eight per core. The daemon runs a dozen threads and more
(the worker loops, the API's loop, their `asyncio.to_thread` executors); each fills its arena with short-lived C
allocations (SQLite pages and rows, JSON, pydantic's buffers), and the freed chunks stay resident in it. Over a
soak of tiny jobs (tests/benchmarks/bench_daemon.py, 600 jobs) the arenas held 45-50 MiB free of 65-73 MiB and
grew with every new peak in any of them: the daemon's RSS rose 1.7 MiB per 100 jobs over the second half while
its Python objects stayed flat (tracemalloc). With two arenas the same run held about 10 MiB free and rose 0.8 MiB
per 100 jobs, at the same submit latency (docs/daemon.md, Memory). Nothing changes where the C library is not
glibc (macOS, musl), nor when MALLOC_ARENA_MAX is set: the user's choice stands.
"""

from __future__ import annotations

import ctypes
import os

ARENAS = 2
M_ARENA_MAX = -8
"""mallopt's parameter number for the arena cap (glibc's malloc.h)."""


def cap_arenas(arenas: int = ARENAS) -> bool:
    """Cap this process's malloc arenas at `arenas`, before it starts its threads (those already running keep
    theirs). True when capped; False off glibc, or when MALLOC_ARENA_MAX is set."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version"):
        return False
    return libc.mallopt(ctypes.c_int(M_ARENA_MAX), ctypes.c_int(arenas)) == 1
