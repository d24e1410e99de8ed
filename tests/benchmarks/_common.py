"""Helpers shared by the benchmark scripts (each `bench_*.py` exposes `run(smoke) -> dict` and prints a table)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def print_figures(title: str, figures: dict[str, float], targets: dict[str, str] | None = None) -> None:
    targets = targets or {}
    print(f"\n{title}")
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        note = f"   (target {targets[key]})" if key in targets else ""
        print(f"  {key:<{width}}  {shown}{note}")
