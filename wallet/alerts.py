"""Budget alerts: a log line always, and a JSON POST to the budget's webhook when it has one.

A charge well above its reservation (metered compute that ran longer than planned: by a cent and a quarter of the
reservation at least, `ledger.overrun_matters`) is an `Overrun`, sent
through the same notifier right after the charge, naming the budgets it counts against; it is not
recorded or posted to a webhook (the thresholds it pushes a budget past are, as `Alert`s).

The ledger records each (budget, period, threshold) once, inside the transaction that crossed it,
so an alert fires exactly once however many processes race past the threshold. The log line is
written after the commit by the ledger's notifier (:func:`log_alert` by default), which never
blocks or fails a money movement; webhook delivery is at least once (:mod:`trainmaster.wallet.outbox`).

A webhook's path and query usually hold its token (`https://hooks.slack.com/services/T…/B…/secret`), so
every message that mentions a URL shows it through :func:`redact_urls`: scheme, host and port only.
"""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from trainmaster.jobs.money import display_usd

log = logging.getLogger("trainmaster.wallet.alerts")

_URL = re.compile(r"(?P<origin>[A-Za-z][A-Za-z0-9+.-]*://)(?:[^/?#\s'\"<>@]*@)?(?P<host>[^/?#\s'\"<>]*)(?P<rest>[^\s'\"<>]*)")


def redact_urls(text: str) -> str:
    """`text` with each URL cut to `scheme://host[:port]`, then `/…` when it had a path, query or fragment;
    credentials before the host are dropped too."""
    return _URL.sub(lambda m: m["origin"] + m["host"] + ("/…" if m["rest"].strip("/") else ""), text)


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

    @property
    def id(self) -> str:
        """Unique per budget, period and threshold: a receiver drops a repeated delivery by it."""
        return f"{self.budget}|{self.period_start:.0f}|{self.percent}"

    def payload(self) -> dict:
        body = asdict(self)
        body.pop("webhook")
        return {"id": self.id, "text": self.message(), **body}


@dataclass(frozen=True)
class Overrun:
    job_id: str
    charged_micro_usd: int
    reserved_micro_usd: int
    budgets: tuple[str, ...] = ()
    """Labels of the budgets the charge counts against."""
    webhook = None  # never posted (a class attribute, not a field)

    def message(self) -> str:
        against = f"; it counts against budget {', '.join(repr(b) for b in self.budgets)}" if self.budgets else ""
        return (f"job {self.job_id} was charged {display_usd(self.charged_micro_usd)}, above its reservation of "
                f"{display_usd(self.reserved_micro_usd)}{against}")


def log_alert(alert: Alert | Overrun) -> None:
    """The ledger's default notifier: one warning line."""
    log.warning(alert.message())
