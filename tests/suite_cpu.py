"""CPU seconds by test, for tests/benchmarks/bench_suite.py: where the suite's CPU goes, not only its wall time.

Registered by tests/conftest.py when `TRAINMASTER_SUITE_CPU` names a folder (bench_suite sets it for the fresh clone's
run). Each test's setup, call and teardown are measured in the process that runs them (an xdist worker): its own CPU
(`RUSAGE_SELF`) and that of the child processes it waited for meanwhile (`RUSAGE_CHILDREN`: a CLI run with
`subprocess.run`, and whatever that CLI waited for in turn). Processes nobody in the test's tree waits for, such as a
local job's detached supervisor and its training process, or a server a fixture keeps for several tests, are not in a
test's figure: the machine's own count (`machine_busy_s`, /proc/stat) is the whole of it. One JSON line per test in
`<folder>/<worker>.jsonl`: `{"id", "self_s", "children_s", "wall_s", "at"}` (`at`: the test's start, Unix time, to line
its figures up with a sampling of the machine's load).
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

ENV = "TRAINMASTER_SUITE_CPU"


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class Recorder:
    """The plugin: one line per test, appended as the test ends."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl"

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        own, children = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
        start, at = time.monotonic(), time.time()
        yield
        line = {"id": item.nodeid, "self_s": round(_cpu(resource.RUSAGE_SELF) - own, 3),
                "children_s": round(_cpu(resource.RUSAGE_CHILDREN) - children, 3),
                "wall_s": round(time.monotonic() - start, 3), "at": round(at, 3)}
        with self.path.open("a") as out:
            out.write(json.dumps(line) + "\n")


def machine_busy_s() -> float | None:
    """CPU seconds every core of this machine has been busy since boot (/proc/stat: all but idle and iowait, steal
    included; None where there is none)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def read(folder: Path) -> list[dict]:
    """Every test's line, from every worker's file."""
    return [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()
            if line.strip()]
