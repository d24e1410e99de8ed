"""`limits.max_usd` while a job runs: what the job has spent, what its next attempt may still spend, and
the reason a run stopped at the cap carries.

Spent is every attempt's recorded cost plus, for one still running, its offer's price times its time so
far (`progress.attempt_cost`: the metered cost as the local backend charges it). The broker compares it
with the cap each time it watches the job (every CLI command's refresh, `submit --wait`, `logs -f`) and
stops the run when it is reached; the local backend also gives its supervisor the time the remaining
money buys, so a run nobody watches stops there too. What was spent is charged: at most the cap plus
the price of the time between the cap being reached and the run being stopped (one watch interval, or
the supervisor's 1 s check, plus the stop's grace for the job to exit).
"""

from __future__ import annotations

from collections.abc import Sequence

from trainmaster.broker.job_progress import attempt_cost
from trainmaster.broker.store import Attempt
from trainmaster.jobs.money import format_usd
from trainmaster.jobs.spec import JobSpec


def spent(attempts: Sequence[Attempt], now: float) -> int:
    """micro-USD the job's attempts cost so far (recorded, or metered for one still running)."""
    return sum(attempt_cost(a, now) for a in attempts)


def remaining(spec: JobSpec, attempts: Sequence[Attempt], now: float) -> int | None:
    """What the job may still spend under its cap (never below 0), None without a cap."""
    if spec.limits.max_usd is None:
        return None
    return max(0, spec.limits.max_usd - spent(attempts, now))


def reached(spec: JobSpec, attempts: Sequence[Attempt], now: float) -> bool:
    return spec.limits.max_usd is not None and spent(attempts, now) >= spec.limits.max_usd


def log_line(spec: JobSpec, spent_micro_usd: int) -> str:
    """What the run's log says when the broker stops it at the cap (the supervisor's own stop says
    `cost cap reached: the attempt's share of limits.max_usd ...`)."""
    return (f"cost cap reached: the job's limits.max_usd, ${format_usd(spec.limits.max_usd or 0)} "
            f"(spent ${format_usd(spent_micro_usd)}); stopping the job")


def reason(spec: JobSpec, spent_micro_usd: int) -> str:
    return (f"stopped at the cost cap limits.max_usd = ${format_usd(spec.limits.max_usd or 0)} "
            f"(spent ${format_usd(spent_micro_usd)})")
