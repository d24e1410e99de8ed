"""What deferring torch._dynamo saves (jobs/lazy_dynamo.py): a shipped recipe's run with its self-check, as a user
starts it (`python -m trainmaster.jobs.recipes.tiny_lm`, a fresh folder each time), with the compiler stack loaded as
torch would (`TRAINMASTER_EAGER_DYNAMO=1`) and deferred (the default): the CPU seconds of the run and the
self-check child it waits for, and the wall time; medians of 5 (1 in the smoke run), the two kinds alternating.

Run: python tests/benchmarks/bench_dynamo.py
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import print_figures  # noqa: E402

RUN = ["-m", "trainmaster.jobs.recipes.tiny_lm", "--d-model", "32", "--layers", "1"]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_run(steps: int, eager: bool) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run and the self-check it waits for."""
    with tempfile.TemporaryDirectory(prefix="bench-dynamo-") as folder:
        env = {**os.environ, "TRAINMASTER_EAGER_DYNAMO": "1" if eager else ""}
        cpu, start = _children_cpu(), time.perf_counter()
        subprocess.run([sys.executable, *RUN, "--steps", str(steps)], cwd=folder, env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return _children_cpu() - cpu, time.perf_counter() - start


def run(smoke: bool = False) -> dict[str, float]:
    repeat, steps = (1, 25) if smoke else (5, 50)
    samples: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for _ in range(repeat):
        for eager in (True, False):
            samples[eager].append(one_run(steps, eager))
    cpu = {eager: statistics.median(s[0] for s in runs) for eager, runs in samples.items()}
    wall = {eager: statistics.median(s[1] for s in runs) for eager, runs in samples.items()}
    figures = {
        f"tiny-lm, {steps} steps + self-check, dynamo loaded: CPU (s)": round(cpu[True], 2),
        f"tiny-lm, {steps} steps + self-check, deferred: CPU (s)": round(cpu[False], 2),
        "CPU deferred / loaded": round(cpu[False] / cpu[True], 3),
        f"tiny-lm, {steps} steps + self-check, dynamo loaded: wall (s)": round(wall[True], 2),
        f"tiny-lm, {steps} steps + self-check, deferred: wall (s)": round(wall[False], 2),
    }
    print_figures("torch._dynamo deferred (jobs/lazy_dynamo.py)", figures, {"CPU deferred / loaded": "< 1"})
    return figures


if __name__ == "__main__":
    run(smoke="--smoke" in sys.argv)
