"""The daemon's malloc arenas: capped at two on glibc (broker/daemon/allocator.py), so eight threads that each
allocate share them instead of each growing an arena of its own; MALLOC_ARENA_MAX, when set, stands."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

HEAP_SPAN = 64 * 2**20
"""A glibc thread arena is a 64 MiB-aligned reservation: its unused tail is an anonymous `---p` mapping ending on
that alignment."""

THREADS = textwrap.dedent("""
    import ctypes, os, sys, threading
    from trainmaster.broker.daemon.allocator import cap_arenas

    capped = cap_arenas() if sys.argv[1] == "cap" else False
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    all_in = threading.Barrier(9)

    def allocate():
        held = [libc.malloc(4096) for _ in range(64)]
        all_in.wait()  # every thread holds its chunks while the arenas are counted
        all_in.wait()
        for p in held:
            libc.free(p)

    threads = [threading.Thread(target=allocate) for _ in range(8)]
    for t in threads:
        t.start()
    all_in.wait()
    heaps = 0
    for line in open("/proc/self/maps"):
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if fields[1] == "---p" and len(fields) == 5 and end % {span} == 0 and end - start >= 2**20:
            heaps += 1
    all_in.wait()
    for t in threads:
        t.join()
    print(capped, heaps)
""").format(span=HEAP_SPAN)


def _arenas(mode: str, **env: str) -> tuple[str, int]:
    clean = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    done = subprocess.run([sys.executable, "-c", THREADS, mode], env={**clean, **env}, capture_output=True,
                          text=True, timeout=60, check=True)
    capped, heaps = done.stdout.split()
    return capped, int(heaps)


def test_eight_allocating_threads_share_the_capped_arenas():
    assert _arenas("cap") == ("True", 1)  # the main arena and one more
    capped, uncapped_heaps = _arenas("free")
    assert capped == "False" and uncapped_heaps >= 4  # without the cap each thread grows an arena of its own


def test_the_users_malloc_arena_max_stands():
    capped, heaps = _arenas("cap", MALLOC_ARENA_MAX="4")
    assert capped == "False" and heaps == 3  # glibc's own cap of four: the main arena and three
