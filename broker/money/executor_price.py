"""The price agreed with an untrusted executor at dispatch: what its accepted work is paid.

An executor we do not control is paid for the job's work, not for the time it says it took: the
offer's price per hour × the planned hours of the job (`StoredPlan.hours`), fixed when the attempt is
dispatched and reserved with it, and never more than that reservation. What billable time the
executor reports changes nothing (an executor that idles earns what an honest one does), and an
attempt that is not accepted (a stall, a rejection) earns nothing at all.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmaster.backends.base import Cost, Offer
from trainmaster.jobs.money import RAO_PER_TAO


@dataclass(frozen=True)
class AgreedPrice:
    """The amount agreed for an attempt's work, in micro-USD and (for a TAO offer) in rao at the offer's rate."""

    micro_usd: int
    rao: int
    rate_micro_usd_per_tao: int | None
    hours: float
    basis: str

    def capped(self, reservation_micro_usd: int) -> AgreedPrice:
        """The price, never above the reservation made for it (the rao scaled down at the same rate)."""
        if self.micro_usd <= reservation_micro_usd:
            return self
        rao = reservation_micro_usd * RAO_PER_TAO // self.rate_micro_usd_per_tao if self.rao else 0
        return AgreedPrice(micro_usd=reservation_micro_usd, rao=rao, rate_micro_usd_per_tao=self.rate_micro_usd_per_tao,
                           hours=self.hours, basis=f"{self.basis}, capped at the reservation")

    def cost(self, rate_at: float) -> Cost:
        """The attempt's cost as recorded: the agreed amount (`rate_at`: when the rate was fixed, at dispatch)."""
        return Cost(micro_usd=self.micro_usd, rao=self.rao, rate_micro_usd_per_tao=self.rate_micro_usd_per_tao,
                    rate_at=rate_at if self.rao else None, billable_seconds=self.hours * 3600, basis=self.basis)


def agreed(offer: Offer, hours: float) -> AgreedPrice:
    """The price of `hours` of the job's work on `offer`: its fixed job price when it quoted one (a miner's
    signed quote), else the hourly price × hours; in rao at the rate its two prices imply for a TAO offer
    (the micro-USD value of those rao), else in micro-USD."""
    if offer.job_price_rao is not None and offer.job_price_micro_usd is not None:
        rate = offer.job_price_micro_usd * RAO_PER_TAO // offer.job_price_rao if offer.job_price_rao else None
        return AgreedPrice(micro_usd=offer.job_price_micro_usd, rao=offer.job_price_rao, rate_micro_usd_per_tao=rate,
                           hours=hours, basis=f"agreed at dispatch: the quoted {offer.job_price_rao} rao for the "
                                              f"job's whole work")
    if offer.price_per_hour_rao:
        rao = round(offer.price_per_hour_rao * hours)
        rate = offer.price_per_hour_micro_usd * RAO_PER_TAO // offer.price_per_hour_rao
        if rate > 0:
            return AgreedPrice(micro_usd=rao * rate // RAO_PER_TAO, rao=rao, rate_micro_usd_per_tao=rate, hours=hours,
                               basis=f"agreed at dispatch: {offer.price_per_hour_rao} rao/h × {hours:g} h of the job's work")
    micro_usd = round(offer.price_per_hour_micro_usd * hours)
    return AgreedPrice(micro_usd=micro_usd, rao=0, rate_micro_usd_per_tao=None, hours=hours,
                       basis=f"agreed at dispatch: {offer.price_per_hour_micro_usd} micro-USD/h × {hours:g} h of the job's work")
