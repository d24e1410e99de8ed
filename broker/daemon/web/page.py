"""What the dashboard shows, read from the state database in one go (blocking: run it in a thread).

- a summary first: jobs running and queued, failed today (UTC), this month's spend against the monthly budgets,
  payments not sent yet;
- the jobs, newest first, a page of PAGE_JOBS at a time, with their live state, the backend they ran on and cost;
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
PAGE_JOBS = 20
"""Jobs per page of the jobs' table: the spend and the curves stay within a screen or two of the top."""
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
class Summary:
    running: int
    queued: int
    failed_today: int
    spent_month: str
    """This month's charges (UTC), in dollars."""
    budget: str | None
    """The monthly budgets' caps against that spend (`$12.00 of $1,000.00 (1%)`), None without one."""
    unsent_payments: int


@dataclass(frozen=True)
class Paging:
    page: int
    pages: int
    total: int
    per_page: int


@dataclass(frozen=True)
class Page:
    summary: Summary
    paging: Paging
    jobs: list[dict]
    spend: charts.Chart
    budgets: list[BudgetLine]
    curves: list[tuple[str, charts.Chart]]
    """(job id, its chart) for the newest jobs that have a fetched metrics file."""
    verdicts: list[dict]


def job_rows(store_path: Path, limit: int = MOST_JOBS, page: int = 1) -> list[dict]:
    """The newest jobs as JSON-ready rows (what the page's table and `/dashboard/api/jobs` show): page `page` of
    `limit` rows."""
    with readings.reading(store_path) as db:
        return [_job(row) for row in readings.jobs(db, limit, (max(1, page) - 1) * limit)]


def paging(store_path: Path, page: int, per_page: int = PAGE_JOBS) -> Paging:
    with readings.reading(store_path) as db:
        return _paging(readings.job_total(db), page, per_page)


def _paging(total: int, page: int, per_page: int) -> Paging:
    pages = max(1, -(-total // per_page))
    return Paging(page=min(max(1, page), pages), pages=pages, total=total, per_page=per_page)


def build(store_path: Path, budgets: list[Budget], now: float | None = None, page: int = 1) -> Page:
    now = time.time() if now is None else now
    month = period_start("month", now)
    monthly = [b for b in budgets if b.period == "month"]
    with readings.reading(store_path) as db:
        paged = _paging(readings.job_total(db), page, PAGE_JOBS)
        rows = readings.jobs(db, PAGE_JOBS, (paged.page - 1) * PAGE_JOBS)
        newest = rows if paged.page == 1 else readings.jobs(db, PAGE_JOBS)
        counts = readings.job_counts(db)
        failed = readings.failed_since(db, period_start("day", now))
        unsent = readings.unsent_payments(db)
        charged = readings.charges_since(db, month)
        usage = readings.budget_usage(db, budgets, now)
        verdicts = readings.verdicts(db, MOST_VERDICTS)
    spent = sum(micro for _, _, micro in charged)
    return Page(
        summary=Summary(running=counts.get("running", 0) + counts.get("dispatched", 0), queued=counts.get("queued", 0),
                        failed_today=failed, spent_month=display_usd(spent),
                        budget=_against(spent, monthly), unsent_payments=unsent),
        paging=paged,
        jobs=[_job(r) for r in rows],
        spend=charts.line_chart("Spend this month (cumulative)", _cumulative(charged, month, now),
                                {f"cap: {b.label}": b.cap / MICRO for b in monthly},
                                x_label="day of the month (UTC)", y_label="USD charged", x_time=True,
                                level_text=_cap_text),
        budgets=[_budget(b, u) for b, u in usage],
        curves=_curves(_home(store_path), [r.id for r in newest]),
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


def _against(spent: int, monthly: list[Budget]) -> str | None:
    if not monthly:
        return None
    cap = min(b.cap for b in monthly)
    return f"{display_usd(spent)} of {display_usd(cap)} ({100 * spent / cap:.0f}%)" if cap else None


def _cap_text(name: str, value: float, highest: float) -> str:
    share = 100 * highest / value if value else 0
    return f"{name} is ${value:,.2f}, far above the chart: {share:.2g}% of it is spent"


def _budget(budget: Budget, usage: readings.Usage) -> BudgetLine:
    percent = round(100 * usage.used_micro_usd / budget.cap) if budget.cap else 100
    return BudgetLine(budget.label, display_usd(usage.used_micro_usd), display_usd(budget.cap), percent)


def _curves(home: Path, job_ids: list[str]) -> list[tuple[str, charts.Chart]]:
    found = []
    for job_id in job_ids:
        series = curves.read_curves(curves.metrics_file(home, job_id))
        if series:
            found.append((job_id, charts.line_chart(job_id, series, x_label="step", y_label="value")))
        if len(found) == MOST_CURVES:
            break
    return found


def _verdict(row: readings.VerdictRow) -> dict:
    return asdict(row)
