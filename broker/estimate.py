"""A job's runtime estimate from its own name's history, for when its spec gives no `estimated_hours`.

In the planner's order: the spec's `estimated_hours`; else, when the job says how many steps it runs
(`--steps N`) and earlier accepted runs of the same name said theirs, N × their median time per step;
else the median runtime of the earlier runs of that name; else (the planner's) its class's history.
Runtimes are in reference GPU-hours (`planner.reference_hours`), so an estimate made on one GPU
scales to another. The basis names where the figure came from: `--dry-run` and `offers` show it.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from trainmaster.backends.base import Offer
from trainmaster.broker.planner import hours_unit, reference_hours
from trainmaster.broker.progress import total_steps
from trainmaster.broker.store import Attempt
from trainmaster.jobs.spec import JobSpec


@dataclass(frozen=True)
class PastRun:
    hours: float
    """Its runtime in reference GPU-hours."""
    steps: int | None
    """The steps it ran (its `--steps N`), None when it did not say."""


def past_run(attempt: Attempt, spec_json: str) -> PastRun:
    """An accepted attempt (with its billable time) of a job recorded with `spec_json`."""
    spec = JobSpec.model_validate_json(spec_json)
    hours = reference_hours((attempt.billable_seconds or 0.0) / 3600, Offer.model_validate_json(attempt.offer_json).gpu_type)
    return PastRun(hours=hours, steps=steps_of(spec))


def steps_of(spec: JobSpec) -> int | None:
    return total_steps(spec.entrypoint, {**os.environ, **spec.env})


def own_estimate(spec: JobSpec, runs: Sequence[PastRun]) -> tuple[float, str] | None:
    """(reference hours, where the figure came from) from the runs of the job's own name, or None."""
    runs = [r for r in runs if r.hours > 0]
    if not runs:
        return None
    steps, stepped = steps_of(spec), [r for r in runs if r.steps]
    if steps and stepped:
        per_step = statistics.median(r.hours / r.steps for r in stepped)
        return (steps * per_step, f"{steps:,} steps (--steps) × {per_step * 3600:.3g} s/step from {len(stepped)} "
                                  f"earlier run(s) of {spec.name!r} ({hours_unit(spec)})")
    hours = statistics.median(r.hours for r in runs)
    return hours, f"history of {spec.name!r}: median of {len(runs)} earlier run(s), {hours:.3g} {hours_unit(spec)}"
