"""What the machine was doing when a test failed: its load, memory and busiest processes, added to the failure's
report (tests/conftest.py), so that a timeout on a shared CI runner says whether the machine was starved (and by
what) or the code under test hung."""

from __future__ import annotations

import os
import time

SAMPLE_S = 0.5
"""How long the processes' CPU is sampled."""
SHOWN = 8
"""How many of the busiest processes are listed."""


def describe() -> str:
    """Load averages, runnable processes, memory and the busiest processes over SAMPLE_S, a line each."""
    import psutil

    from trainmaster.jobs.cpus import usable_cpus

    one, five, fifteen = os.getloadavg()
    memory = psutil.virtual_memory()
    lines = [f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {usable_cpus()} cores; "
             f"memory {memory.used / 2**30:.1f} GiB used, {memory.available / 2**30:.1f} GiB available "
             f"of {memory.total / 2**30:.1f}"]
    procs = list(psutil.process_iter(["pid", "name"]))
    for proc in procs:
        try:
            proc.cpu_percent(None)  # the first call starts the sample
        except psutil.Error:
            pass
    time.sleep(SAMPLE_S)
    rows, running = [], 0
    for proc in procs:
        try:
            with proc.oneshot():
                busy, state = proc.cpu_percent(None), proc.status()
                running += state == psutil.STATUS_RUNNING
                if busy > 0:
                    rows.append((busy, proc.pid, " ".join(proc.cmdline())[:160] or proc.info["name"]))
        except psutil.Error:
            continue
    lines.append(f"{len(procs)} processes, {running} running; the busiest over {SAMPLE_S:g} s (% of one core):")
    lines += [f"  {busy:5.0f} %  {pid:>7}  {command}" for busy, pid, command in sorted(rows, reverse=True)[:SHOWN]]
    return "\n".join(lines)
