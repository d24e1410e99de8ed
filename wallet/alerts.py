"""Budget alerts: a log line always, and a JSON POST to the budget's webhook when it has one.

The ledger records each (budget, period, threshold) once, inside the transaction that crossed it,
so an alert fires exactly once however many processes race past the threshold. Delivery happens
after the commit and never blocks or fails a money movement: a webhook that is down is logged.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from trainmaster.jobs.money import display_usd

log = logging.getLogger("trainmaster.wallet.alerts")
WEBHOOK_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Alert:
    budget: str
    percent: int
    period: str
    period_start: float
    cap_micro_usd: int
    used_micro_usd: int
    webhook: str | None = None

    def message(self) -> str:
        since = (
            "" if self.period == "total"
            else f" this {self.period} (since {datetime.fromtimestamp(self.period_start, timezone.utc):%Y-%m-%d})"
        )
        return (
            f"budget '{self.budget}' reached {self.percent}% of its cap{since}: "
            f"{display_usd(self.used_micro_usd)} of {display_usd(self.cap_micro_usd)} spent or reserved"
        )

    def payload(self) -> dict:
        body = asdict(self)
        body.pop("webhook")
        return {"text": self.message(), **body}


async def post_alert(alert: Alert, *, timeout_s: float = WEBHOOK_TIMEOUT_S) -> int:
    """POST the alert to its webhook; returns the HTTP status. Raises on connection errors."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async with session.post(alert.webhook, json=alert.payload()) as response:
            return response.status


def log_and_post(alert: Alert) -> threading.Thread | None:
    """The ledger's default notifier: log now, POST in a background thread (returned, for joining).

    The thread is not a daemon, so a short-lived CLI process waits for the POST (at most
    WEBHOOK_TIMEOUT_S) before exiting instead of dropping it.
    """
    log.warning(alert.message())
    if not alert.webhook:
        return None
    thread = threading.Thread(target=_deliver, args=(alert,), name="budget-alert")
    thread.start()
    return thread


def _deliver(alert: Alert) -> None:
    try:
        status = asyncio.run(post_alert(alert))
    except Exception as exc:  # an unreachable webhook must not break the ledger
        log.error("budget alert webhook %s failed: %s", alert.webhook, exc)
        return
    if status >= 300:
        log.error("budget alert webhook %s answered HTTP %d", alert.webhook, status)
