"""The daemon's observability routes: Prometheus `GET /metrics` and the dashboard under `/dashboard`.

`add_routes` is called by the daemon's `make_app` (broker/daemon/app.py). Authentication is the
daemon middleware's (a bearer token or the `trainmaster_token` cookie); the one part of it done here
is `/dashboard?token=…`, which sets that cookie and redirects (broker/daemon/web/dashboard.py).
Everything here only reads the state database, off the event loop.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from trainmaster.broker.daemon.web import dashboard, metrics


def add_routes(app: web.Application, store_path: Path, *, budgets: metrics.BudgetSource = tuple,
               lag_source: metrics.LagSource | None = None) -> None:
    """GET `/metrics`, `/dashboard` and the dashboard's JSON under `/dashboard/api/…`.

    `budgets` gives the budgets in force (the policy's) at each scrape and page view; `lag_source`, when
    given, how far behind each trigger is (exposed as `trainmaster_trigger_lag_seconds`)."""
    where = Path(store_path) if isinstance(store_path, Path) else store_path  # a path, or a database URL
    collector = metrics.StoreCollector(where, budgets, lag_source)
    views = dashboard.Views(where, budgets)
    app.router.add_get("/metrics", metrics.handler(collector))
    app.router.add_get("/dashboard", views.page)
    app.router.add_get("/dashboard/api/jobs", views.jobs)
    app.router.add_get("/dashboard/api/jobs/{job_id}/metrics", views.job_metrics)
    app.router.add_get("/dashboard/api/spend", views.spend)
    app.router.add_get("/dashboard/api/verdicts", views.verdicts)
