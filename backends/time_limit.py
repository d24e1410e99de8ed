"""The time an attempt may run: the spec's `limits.max_hours`, or sooner the time its share of `limits.max_usd`
buys at the offer's price. The local backend's supervisor stops a run there (even when no broker watches it), and
a managed service is given it as the job's maximum runtime.
"""

from __future__ import annotations

from trainmaster.backends.base import AttemptContext, Offer
from trainmaster.jobs.money import display_usd
from trainmaster.jobs.spec import JobSpec


def max_seconds(spec: JobSpec, offer: Offer, ctx: AttemptContext) -> float | None:
    """The supervisor's time limit: `limits.max_hours`, or sooner the time the attempt's share of
    `limits.max_usd` buys at the offer's price (whole seconds, rounded down), whichever comes first."""
    limits = [spec.limits.max_hours * 3600] if spec.limits.max_hours else []
    price = offer.price_per_hour_micro_usd
    if ctx.max_micro_usd is not None and price > 0:
        limits.append(max(1, ctx.max_micro_usd * 3600 // price))  # 0 would read as no limit
    return min(limits) if limits else None


def time_limit(spec: JobSpec, offer: Offer, ctx: AttemptContext) -> str | None:
    """Which limit `max_seconds` is and its value, for the reason of a job stopped by it."""
    seconds = max_seconds(spec, offer, ctx)
    if seconds is None:
        return None
    if spec.limits.max_hours and seconds == spec.limits.max_hours * 3600:
        return f"limits.max_hours = {spec.limits.max_hours:g} ({seconds:,.0f} s)"
    return (f"the attempt's share of limits.max_usd, {display_usd(ctx.max_micro_usd)} at "
            f"{display_usd(offer.price_per_hour_micro_usd)}/hour ({seconds:,.0f} s)")
