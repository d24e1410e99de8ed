"""The offer request the broker asks every backend with: the spec and what around it changes a price.

Built once per plan from the job's spec and the policy it is planned under: the class's constraints,
where catalogs are read and how old they may be, the TAO/USD rate from the broker's rate provider,
the data sizes the spec declares and the job's total steps T (its `--steps`), so the planner prices
egress and the replay audit's overhead from the job itself rather than from defaults.
"""

from __future__ import annotations

import os

from trainmaster.backends.base import CatalogSettings, OfferConstraints, OfferRequest
from trainmaster.broker import paths
from trainmaster.broker.planning.policy import Policy
from trainmaster.broker.job_progress import total_steps
from trainmaster.jobs.spec import JobSpec
from trainmaster.wallet.rates import Rate, RateError, RateProvider, rate_provider


def offer_request(spec: JobSpec, policy: Policy, rate: Rate | None) -> OfferRequest:
    con = policy.for_class(spec.workload).constraints
    return OfferRequest(
        spec=spec,
        constraints=OfferConstraints(spot_allowed=con.spot_allowed, regions=con.regions, gpu_types=con.gpu_types,
                                     max_usd_per_hour_micro=con.max_usd_per_hour),
        catalog=CatalogSettings(override_dir=str(paths.config_dir() / "catalogs"),
                                refreshed_dir=str(paths.refreshed_catalogs_dir()),
                                max_age_days=policy.catalog.max_age_days),
        rate=rate,
        data_bytes=data_sizes(spec),
        total_steps=total_steps(spec.entrypoint, {**os.environ, **spec.env}),
    )


def data_sizes(spec: JobSpec) -> dict[str, int]:
    """The size of each data source whose size the spec declares, by name."""
    return {item.name: item.size_bytes for item in spec.data if item.size_bytes is not None}


def provider_for(policy: Policy) -> RateProvider | None:
    """The rate provider the policy configures (None when it sets no rate)."""
    return rate_provider(policy.tao_rate.usd_per_tao, policy.tao_rate.source)


async def current_rate(provider: RateProvider | None) -> tuple[Rate | None, str | None]:
    """The provider's rate now, or None and why (a source that cannot be read leaves TAO prices unrated)."""
    if provider is None:
        return None, None
    try:
        return await provider.current(), None
    except RateError as exc:
        return None, f"TAO/USD rate: {exc}"
