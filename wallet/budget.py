"""Budgets: a cap on spend per period, optionally narrowed to a backend, a workload class or a project.

Budgets are declared in the cost policy (`Policy.budgets`) and enforced by the ledger, which checks
and reserves in one transaction. A budget counts the charges made since its period began plus every
reservation not yet settled (whenever it was made: it will be charged now or later, so it must fit
now). Periods are calendar periods in UTC; `total` never resets.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trainmaster.jobs.money import display_usd
from trainmaster.jobs.spec import Usd, Workload

Period = Literal["day", "week", "month", "total"]


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=True)

    name: str | None = Field(None, description="Shown in alerts and errors; default: derived from the scope.")
    cap: Usd = Field(description="Most that may be spent (charged + reserved) in one period, in USD.")
    period: Period = Field("month", description="day, week (from Monday), month, or total (never resets); UTC.")
    backend: str | None = Field(None, description="Only spend on this backend; default: all.")
    workload: Workload | None = Field(None, description="Only spend of this workload class; default: all.")
    project: str | None = Field(None, description="Only spend of this project; default: all.")
    hard: bool = Field(True, description="Refuse a reservation that would go over the cap; false: alerts only.")
    alert_at_percent: list[int] = Field(
        default_factory=lambda: [80, 100], description="Alert once per period when use reaches these percents of the cap."
    )
    webhook: str | None = Field(None, description="URL that each alert is POSTed to as JSON.")

    @field_validator("alert_at_percent")
    @classmethod
    def _percents(cls, value: list[int]) -> list[int]:
        if any(p <= 0 or p > 1000 for p in value):
            raise ValueError("percents must be between 1 and 1000")
        return sorted(set(value))

    @field_validator("webhook")
    @classmethod
    def _webhook(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value

    @property
    def scope(self) -> str:
        """What the budget covers (`backend=aws, project=vision`), empty for all spend."""
        parts = (("backend", self.backend), ("workload", self.workload), ("project", self.project))
        return ", ".join(f"{k}={v}" for k, v in parts if v)

    @property
    def label(self) -> str:
        """A stable name: the given one, or the scope (`month: backend=aws`)."""
        return self.name or f"{self.period}: {self.scope or 'all spend'}"

    def describe(self) -> str:
        per = "in all" if self.period == "total" else f"per {self.period}"
        return f"budget '{self.label}' ({display_usd(self.cap)} {per}{'' if self.hard else ', alerts only'})"

    def matches(self, *, backend: str, workload: str, project: str | None) -> bool:
        return (
            (self.backend is None or self.backend == backend)
            and (self.workload is None or self.workload == workload)
            and (self.project is None or self.project == project)
        )

    def period_start(self, at: float) -> float:
        """Unix time at which the period holding `at` began (0 for `total`)."""
        return period_start(self.period, at)


def period_start(period: Period, at: float) -> float:
    moment = datetime.fromtimestamp(at, timezone.utc)
    midnight = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        start = midnight
    elif period == "week":
        start = midnight - timedelta(days=midnight.weekday())
    elif period == "month":
        start = midnight.replace(day=1)
    else:
        return 0.0
    return start.timestamp()
