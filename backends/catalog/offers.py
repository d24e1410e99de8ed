"""Offers priced from a catalog: what the managed backends (SageMaker, Vertex AI, Azure ML) offer.

Each catalog row that fits the request's spec becomes an on-demand offer and, when the request's
constraints allow spot and the row has a spot price, a spot offer. The catalog is read from where the
request says (the user's override folder) and warned about past the request's maximum age. Offers
carry `detail.price_source = "catalog"` and the catalog's date, and name the catalog row as their
quote's source, so tables can mark them as list prices rather than live quotes. A gcp offer with GPUs
also carries `detail.accelerator` ({"type": "NVIDIA_TESLA_T4", "count": 1}): what Vertex takes beside the
machine type.
"""

from __future__ import annotations

from collections import Counter
from datetime import date
from pathlib import Path

from trainmaster.backends.base import Offer, OfferRequest, OfferSet
from trainmaster.backends.catalog.accelerators import vertex_accelerator
from trainmaster.backends.catalog.gpus import gpu_matches
from trainmaster.backends.catalog.load import Catalog, CatalogRow, load_catalog
from trainmaster.jobs.spec import JobSpec

START_DELAY_S = {False: 300, True: 600}
"""Typical wait before a managed training job runs: about 5 minutes on demand; spot may wait for capacity."""


def catalog_offers(cloud: str, request: OfferRequest, *, catalog: Catalog | None = None,
                   today: date | None = None) -> OfferSet:
    """The offers `cloud`'s catalog makes for the request, or the reasons it makes none."""
    spec, spot_allowed, where = request.spec, request.constraints.spot_allowed, request.catalog
    catalog = catalog or load_catalog(cloud, override_dir=Path(where.override_dir) if where.override_dir else None,
                                      refreshed_dir=Path(where.refreshed_dir) if where.refreshed_dir else None,
                                      max_age_days=where.max_age_days, today=today)
    offers, misfits = [], Counter()
    for row in catalog.rows:
        why = unfit(row, spec)
        if why:
            misfits[why] += 1
            continue
        offers.append(_offer(row, spec, spot=False, price=row.on_demand_micro_usd))
        if spot_allowed and row.spot_micro_usd is not None:
            offers.append(_offer(row, spec, spot=True, price=row.spot_micro_usd))
    reasons = [] if offers else [
        f"no {cloud} instance in the catalog fits: " + "; ".join(f"{n} {why}" for why, n in misfits.most_common())
    ]
    return OfferSet(backend=cloud, offers=offers, reasons=reasons)


def unfit(row: CatalogRow, spec: JobSpec) -> str | None:
    """Why an instance cannot run the spec (None when it can)."""
    res = spec.resources
    if row.gpu_count < res.gpus:
        return f"with fewer than {res.gpus} GPU(s)"
    if res.gpus and not gpu_matches(row.gpu_type, res.gpu_types):
        return f"with GPUs other than {'/'.join(res.gpu_types)}"
    if res.gpus and res.min_vram_gb and (row.gpu_memory_gb or 0) < res.min_vram_gb:
        return f"with less than {res.min_vram_gb} GB per GPU"
    if row.vcpus < res.cpus:
        return f"with fewer than {res.cpus} vCPUs"
    if res.memory_gb and row.memory_mb < res.memory_gb * 1024:
        return f"with less than {res.memory_gb} GB of memory"
    return None


def _offer(row: CatalogRow, spec: JobSpec, *, spot: bool, price: int) -> Offer:
    return Offer(
        backend=row.cloud, instance=row.instance, region=row.region, gpu_type=row.gpu_type, gpu_count=row.gpu_count,
        gpu_memory_mb=row.gpu_memory_gb * 1024 if row.gpu_memory_gb else None, cpus=row.vcpus, memory_mb=row.memory_mb,
        nodes=spec.resources.nodes, spot=spot, price_per_hour_micro_usd=price, expected_start_s=START_DELAY_S[spot],
        trusted=True, detail=_detail(row, spot), quote={"source": f"catalog {row.source} ({row.date.isoformat()})"},
    )


def _detail(row: CatalogRow, spot: bool) -> dict:
    detail = {"price_source": "catalog", "catalog_date": row.date.isoformat(), "catalog_row": row.source}
    if spot:  # a service that bills spot as fewer seconds at the on-demand price (SageMaker) is charged at this
        detail["on_demand_micro_usd_per_hour"] = row.on_demand_micro_usd
    if row.cloud == "gcp" and row.gpu_count:
        detail["accelerator"] = {"type": vertex_accelerator(row.gpu_type, row.gpu_memory_gb), "count": row.gpu_count}
    return detail
