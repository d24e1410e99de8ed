"""Loss and return curves from a job's `metrics.jsonl`, as the broker fetched it.

The source is the job's fetched outputs (`<home>/jobs/<id>/outputs/metrics.jsonl`, where the broker
puts what it fetched): the broker's own copy, never a backend's folder. A job still running has no
curve until its outputs are fetched. Lines that are not JSON objects with a numeric `step` (a torn
last line, an executor's garbage) are skipped; values that are not finite numbers are skipped.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from trainmaster.jobs.metrics import FILENAME

MOST_BYTES = 8 * 1024 * 1024
"""A metrics file is read up to this size: an executor's huge file cannot exhaust the daemon."""
MOST_POINTS = 400
"""Points kept per series (evenly thinned): enough for a chart, small for the page."""
MOST_SERIES = 3
PREFERRED = re.compile(r"loss|return|reward", re.IGNORECASE)

Series = dict[str, list[tuple[float, float]]]


def metrics_file(home: Path, job_id: str) -> Path | None:
    """Where the job's fetched metrics are; None for an id that is not one folder name (`..`, `a/b`)."""
    if Path(job_id).name != job_id or job_id in {"", ".", ".."}:
        return None
    return home / "jobs" / job_id / "outputs" / FILENAME


def read_curves(path: Path | None) -> Series:
    """The job's curves by metric name: (step, value) points, the loss/return/reward ones first."""
    if path is None:
        return {}
    try:
        with open(path, "rb") as handle:
            text = handle.read(MOST_BYTES).decode("utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return {}
    series: Series = {}
    for line in text.splitlines():
        for name, point in _points(line):
            series.setdefault(name, []).append(point)
    chosen = sorted(series, key=lambda n: (not PREFERRED.search(n), n))[:MOST_SERIES]
    return {name: _thin(series[name]) for name in chosen}


def _points(line: str) -> list[tuple[str, tuple[float, float]]]:
    try:
        record = json.loads(line)
    except ValueError:
        return []
    if not isinstance(record, dict) or not _number(record.get("step")):
        return []
    step = float(record["step"])
    return [(str(k), (step, float(v))) for k, v in record.items() if k != "step" and _number(v)]


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _thin(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(points) <= MOST_POINTS:
        return points
    stride = len(points) / MOST_POINTS
    return [points[int(i * stride)] for i in range(MOST_POINTS - 1)] + [points[-1]]
