"""What the dashboard shows, read from the state database in one go (blocking: run it in a thread).

- the newest jobs, with their live state, latest backend and cost;
- spend this month (UTC), cumulative per backend, against the monthly budgets' caps, and every
  budget as the ledger counts it;
- each recent job's loss/return curves (from its fetched `metrics.jsonl`, broker/daemon/web/curves.py);
- the newest verdicts, with their reasons, checks and evidence.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from trainmaster.broker.daemon.web import charts, curves, readings
from trainmaster.jobs.money import display_usd
from trainmaster.wallet.budget import Budget, period_start

MOST_JOBS = 50
MOST_CURVES = 6
MOST_VERDICTS = 20
MICRO = 1_000_000


@dataclass(frozen=True)
class BudgetLine:
    label: str
    used: str
    cap: str
    percent: int


@dataclass(frozen=True)
class Page:
    jobs: list[dict]
    spend: charts.Chart
    budgets: list[BudgetLine]
    curves: list[tuple[str, charts.Chart]]
    """(job id, its chart) for the newest jobs that have a fetched metrics file."""
    verdicts: list[dict]


def job_rows(store_path: Path, limit: int = MOST_JOBS) -> list[dict]:
    """The newest jobs as JSON-ready rows (what the page's table and `/dashboard/api/jobs` show)."""
    with readings.reading(store_path) as db:
        return [_job(row) for row in readings.jobs(db, limit)]


def build(store_path: Path, budgets: list[Budget], now: float | None = None) -> Page:
    now = time.time() if now is None else now
    month = period_start("month", now)
    with readings.reading(store_path) as db:
        rows = readings.jobs(db, MOST_JOBS)
        charged = readings.charges_since(db, month)
        usage = readings.budget_usage(db, budgets, now)
        verdicts = readings.verdicts(db, MOST_VERDICTS)
    return Page(
        jobs=[_job(r) for r in rows],
        spend=charts.line_chart("Spend this month (USD, cumulative)", _cumulative(charged, month, now),
                                {f"cap: {b.label}": b.cap / MICRO for b in budgets if b.period == "month"}),
        budgets=[_budget(b, u) for b, u in usage],
        curves=_curves(_home(store_path), [r.id for r in rows]),
        verdicts=[_verdict(v) for v in verdicts],
    )


def spend(store_path: Path, budgets: list[Budget], now: float | None = None) -> dict:
    """Charged per backend (ever) and each budget as the ledger counts it: `/dashboard/api/spend`."""
    now = time.time() if now is None else now
    with readings.reading(store_path) as db:
        charged = readings.charged_by_backend(db)
        usage = readings.budget_usage(db, budgets, now)
    return {"by_backend": {r.backend: {"micro_usd": r.micro_usd, "rao": r.rao} for r in charged},
            "budgets": [asdict(_budget(b, u)) for b, u in usage]}


def verdict_rows(store_path: Path, limit: int = MOST_VERDICTS) -> list[dict]:
    """The newest verdicts as JSON-ready rows: `/dashboard/api/verdicts`."""
    with readings.reading(store_path) as db:
        return [_verdict(v) for v in readings.verdicts(db, limit)]


def job_curves(store_path: Path, job_id: str) -> curves.Series | None:
    """A job's curves (None when there is no such job): what `/dashboard/api/jobs/{id}/metrics` answers."""
    with readings.reading(store_path) as db:
        if not readings.job_exists(db, job_id):
            return None
    return curves.read_curves(curves.metrics_file(_home(store_path), job_id))


def _home(store_path: Path | str) -> Path:
    """Where the jobs' metric files are: beside the state file, or the home when the state is on a server."""
    from trainmaster.broker import paths

    return store_path.parent if isinstance(store_path, Path) else paths.home()


def _job(row: readings.JobRow) -> dict:
    return {**asdict(row), "cost": display_usd(row.cost_micro_usd)}


def _cumulative(charged: list[tuple[float, str, int]], start: float, now: float) -> dict[str, list[tuple[float, float]]]:
    """Per backend: (unix time, dollars charged since `start`), from 0 at the start to the total now."""
    series: dict[str, list[tuple[float, float]]] = {}
    totals: dict[str, int] = {}
    for at, backend, micro_usd in charged:
        points = series.setdefault(backend, [(start, 0.0)])
        totals[backend] = totals.get(backend, 0) + micro_usd
        points.append((at, totals[backend] / MICRO))
    for backend, points in series.items():
        points.append((now, totals[backend] / MICRO))
    return series


def _budget(budget: Budget, usage: readings.Usage) -> BudgetLine:
    percent = round(100 * usage.used_micro_usd / budget.cap) if budget.cap else 100
    return BudgetLine(budget.label, display_usd(usage.used_micro_usd), display_usd(budget.cap), percent)


def _curves(home: Path, job_ids: list[str]) -> list[tuple[str, charts.Chart]]:
    found = []
    for job_id in job_ids:
        series = curves.read_curves(curves.metrics_file(home, job_id))
        if series:
            found.append((job_id, charts.line_chart(job_id, series)))
        if len(found) == MOST_CURVES:
            break
    return found


def _verdict(row: readings.VerdictRow) -> dict:
    return asdict(row)
