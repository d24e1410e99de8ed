"""The chunk hasher's thread pool is sized by the cores this process may run on (its CPU affinity: a container's
or a `taskset`'s share), not by the host's count, which a container's process sees too."""

from __future__ import annotations

import os
import subprocess
import sys


def test_the_hashing_pool_has_a_thread_per_core_this_process_may_use():
    probe = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
             "from trainmaster.jobs import chunks; print(os.cpu_count(), chunks._pool()._max_workers)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    host, workers = map(int, done.stdout.split())
    assert host == os.cpu_count() and workers == 1
