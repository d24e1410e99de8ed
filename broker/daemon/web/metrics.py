"""Prometheus `/metrics`: a collector that reads the state database at scrape time.

Every scrape builds a fresh `CollectorRegistry` holding one `StoreCollector`, so nothing is kept
between scrapes (no global registry, no counters in memory that a restart would reset): the numbers
are the database's. Money is exposed in dollars (the ledger's integer micro-USD / 10**6) and in rao.

- `trainmaster_jobs{state}`: jobs per state, every state named;
- `trainmaster_spend_usd_total{backend}`, `trainmaster_spend_rao_total{backend}`: charged, ever;
- `trainmaster_reserved_usd{backend}`: held by reservations not yet settled;
- `trainmaster_verdicts_total{outcome}`: verdicts recorded (a re-verification counts again);
- `trainmaster_queue_latency_seconds`: a histogram of submission → first dispatch, per job;
- `trainmaster_budget_used_usd{budget}`, `trainmaster_budget_cap_usd{budget}`: each budget as the
  ledger counts it (charged in its period + held);
- `trainmaster_trigger_lag_seconds{trigger}`: only when a `lag_source` is given (the triggers' engine
  says how far behind each trigger is).
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from trainmaster.broker.daemon.web import readings
from trainmaster.wallet.budget import Budget

LagSource = Callable[[], Mapping[str, float]]
"""Seconds each trigger is behind (by trigger name); called at scrape time, off the event loop."""
BudgetSource = Callable[[], Sequence[Budget]]
"""The budgets in force (the policy's); called at each scrape and page view."""
LATENCY_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)
MICRO = 1_000_000


class StoreCollector(Collector):
    def __init__(self, store_path: Path, budgets: BudgetSource, lag_source: LagSource | None,
                 clock: Callable[[], float] = time.time):
        self.store_path, self.budgets, self.lag_source, self.clock = store_path, budgets, lag_source, clock

    def collect(self) -> Iterator[Metric]:
        with readings.reading(self.store_path) as db:
            yield _jobs(readings.job_counts(db))
            yield from _spend(readings.charged_by_backend(db), readings.reserved_by_backend(db))
            yield _verdicts(readings.verdict_counts(db))
            yield _latency(readings.queue_latencies(db))
            yield from _budgets(readings.budget_usage(db, self.budgets(), self.clock()))
        if self.lag_source is not None:
            yield _lag(self.lag_source())


def render(collector: StoreCollector) -> bytes:
    """The exposition text of one scrape (blocking: run it in a thread)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)


def _jobs(counts: Mapping[str, int]) -> Metric:
    family = GaugeMetricFamily("trainmaster_jobs", "Jobs in each state.", labels=["state"])
    for state, n in sorted(counts.items()):
        family.add_metric([state], n)
    return family


def _spend(charged: list[readings.BackendSpend], held: list[readings.BackendSpend]) -> Iterator[Metric]:
    usd = CounterMetricFamily("trainmaster_spend_usd", "Charged on each backend, in US dollars.", labels=["backend"])
    rao = CounterMetricFamily("trainmaster_spend_rao", "Charged on each backend, in rao.", labels=["backend"])
    for row in charged:
        usd.add_metric([row.backend], row.micro_usd / MICRO)
        rao.add_metric([row.backend], row.rao)
    reserved = GaugeMetricFamily("trainmaster_reserved_usd", "Held by unsettled reservations, in US dollars.",
                                 labels=["backend"])
    for row in held:
        reserved.add_metric([row.backend], row.micro_usd / MICRO)
    yield from (usd, rao, reserved)


def _verdicts(counts: Mapping[str, int]) -> Metric:
    family = CounterMetricFamily("trainmaster_verdicts", "Verdicts recorded, by outcome.", labels=["outcome"])
    for outcome, n in sorted(counts.items()):
        family.add_metric([outcome], n)
    return family


def _latency(seconds: list[float]) -> Metric:
    ordered = sorted(seconds)
    cumulative = [(str(bound), bisect.bisect_right(ordered, bound)) for bound in LATENCY_BUCKETS]
    return HistogramMetricFamily(
        "trainmaster_queue_latency_seconds", "Seconds from a job's submission to its first dispatch.",
        buckets=[*cumulative, ("+Inf", len(ordered))], sum_value=sum(ordered),
    )


def _budgets(usage: list[tuple[Budget, readings.Usage]]) -> Iterator[Metric]:
    used = GaugeMetricFamily("trainmaster_budget_used_usd", "Charged in the budget's period plus held, in US dollars.",
                             labels=["budget"])
    cap = GaugeMetricFamily("trainmaster_budget_cap_usd", "The budget's cap per period, in US dollars.",
                            labels=["budget"])
    for budget, now in usage:
        used.add_metric([budget.label], now.used_micro_usd / MICRO)
        cap.add_metric([budget.label], budget.cap / MICRO)
    yield from (used, cap)


def _lag(lags: Mapping[str, float]) -> Metric:
    family = GaugeMetricFamily("trainmaster_trigger_lag_seconds", "How far behind each trigger is, in seconds.",
                               labels=["trigger"])
    for name, seconds in sorted(lags.items()):
        family.add_metric([name], seconds)
    return family


def handler(collector: StoreCollector) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The `/metrics` handler: one scrape in a thread; 503 while the state database cannot be read."""

    async def scrape(request: web.Request) -> web.Response:
        try:
            body = await asyncio.to_thread(render, collector)
        except readings.StateMissing as exc:
            raise web.HTTPServiceUnavailable(text=str(exc)) from None
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    return scrape
