"""Vertex AI's training prices from the Cloud Billing Catalog API, built per machine type from its SKUs.

`GET {endpoint}/v1/services/{Vertex AI}/skus?currencyCode=USD&pageToken=…` lists every SKU of the service,
paged by `nextPageToken`. Vertex bills custom training per vCPU-hour and GiB-hour of the machine family
("… Training … N1 Predefined Instance Core running in Americas", "… Instance Ram …") plus per GPU-hour
("… Nvidia Tesla T4 GPU …"); a SKU applies in each of its `serviceRegions`, on demand (`category.usageType`
OnDemand) or as Spot (Preemptible); its price is `pricingInfo[0].pricingExpression.tieredRates[-1].unitPrice`
({units, nanos}). A row's price is core × vCPUs + RAM × GiB + GPU × count, rounded to micro-USD once.
An API key (`TRAINMASTER_GCP_API_KEY`) is sent when set; the API refuses calls without one.
"""

from __future__ import annotations

import os
import re
from decimal import Decimal

from trainmaster.backends.catalog.load import CatalogRow
from trainmaster.backends.catalog.refresh.http import get_json, open_session
from trainmaster.backends.catalog.refresh.parse import PriceParseError, dig, nanos_to_micro
from trainmaster.backends.catalog.refresh.write import Price

API = "Cloud Billing Catalog API"
SERVICE_ID = "C7E2-9256-1C43"  # Vertex AI
ENDPOINT_ENV = "TRAINMASTER_GCP_BILLING_ENDPOINT"
KEY_ENV = "TRAINMASTER_GCP_API_KEY"
DEFAULT_ENDPOINT = "https://cloudbilling.googleapis.com"
SOURCE = (f"source: {API} ({DEFAULT_ENDPOINT}/v1/services/{SERVICE_ID}/skus), Vertex AI custom training SKUs:\n"
          "machine family core x vCPUs + RAM x GiB + GPU x count; spot_usd_per_hour: the Preemptible SKUs "
          "(else the shipped discount applied).")
MAX_PAGES = 100
USAGES = {"OnDemand": "on_demand", "Preemptible": "spot"}
GPU_NAMES = {("T4", None): "Tesla T4", ("V100", None): "Tesla V100", ("P100", None): "Tesla P100",
             ("P4", None): "Tesla P4", ("A100", 40): "Tesla A100", ("A100", 80): "A100 80GB", ("L4", None): "L4",
             ("H100", None): "H100 80GB", ("H200", None): "H200 141GB"}
UNITS = {"core": "h", "ram": "GiBy.h", "gpu": "h"}

Table = dict[tuple[str, str, str, str], Decimal]
"""(usage, region, component, name) -> price in billionths of a dollar per unit; component core/ram/gpu."""


async def prices(rows: tuple[CatalogRow, ...]) -> dict[tuple[str, str], Price]:
    table = sku_table(await _skus())
    found = {}
    for row in rows:
        on_demand = machine_nanos(row, table, "on_demand")
        if on_demand is not None:
            spot = machine_nanos(row, table, "spot")
            found[row.key] = Price(nanos_to_micro(on_demand), None if spot is None else nanos_to_micro(spot))
    return found


async def _skus() -> list[dict]:
    endpoint = os.environ.get(ENDPOINT_ENV, DEFAULT_ENDPOINT).rstrip("/")
    url = f"{endpoint}/v1/services/{SERVICE_ID}/skus"
    params = {"currencyCode": "USD", "pageSize": "5000"}
    if os.environ.get(KEY_ENV):
        params["key"] = os.environ[KEY_ENV]
    skus: list[dict] = []
    async with open_session() as session:
        for page in range(MAX_PAGES):
            body = await get_json(session, url, api=API, params=params)
            found = body.get("skus", [])
            if not isinstance(found, list):
                raise PriceParseError(f"{API}: page {page + 1}: skus: expected a list")
            skus += found
            token = body.get("nextPageToken")
            if not token:
                return skus
            params = {**params, "pageToken": str(token)}
    raise PriceParseError(f"{API}: nextPageToken: more than {MAX_PAGES} pages")


def sku_table(skus: list[dict]) -> Table:
    """The training SKUs' hourly prices by usage, region and what they price (other SKUs are left out)."""
    table: Table = {}
    for i, sku in enumerate(skus):
        where = f"skus[{i}]."
        if not isinstance(sku, dict):
            raise PriceParseError(f"{API}: skus[{i}]: expected an object")
        usage = USAGES.get(dig(sku, "category.usageType", api=API, where=where))
        what = component(str(dig(sku, "description", api=API, where=where)))
        if usage is None or what is None:
            continue
        nanos = unit_nanos(sku, where, UNITS[what[0]])
        regions = dig(sku, "serviceRegions", api=API, where=where)
        if not isinstance(regions, list):
            raise PriceParseError(f"{API}: {where}serviceRegions: expected a list")
        for region in regions:
            table.setdefault((usage, region, *what), nanos)
    return table


def component(description: str) -> tuple[str, str] | None:
    """("core", "N1"), ("ram", "N1"), ("gpu", "tesla t4") for a training SKU's description; None for others."""
    if "Training" not in description:
        return None
    if match := re.search(r"\b([A-Z]\d+)\b.*\bInstance (Core|Ram)\b", description):
        return match.group(2).lower(), match.group(1)
    if match := re.search(r"\bNvidia (.+?) GPU\b", description, re.IGNORECASE):
        return "gpu", match.group(1).lower()
    return None


def unit_nanos(sku: dict, where: str, unit: str) -> Decimal:
    """The SKU's last-tier unit price, in billionths of a dollar; checks it is priced per `unit`."""
    info = dig(sku, "pricingInfo", api=API, where=where)
    if not isinstance(info, list) or not info:
        raise PriceParseError(f"{API}: {where}pricingInfo: expected a non-empty list")
    expression = dig(info[0], "pricingExpression", api=API, where=f"{where}pricingInfo[0].")
    if expression.get("usageUnit") != unit:
        raise PriceParseError(f"{API}: {where}pricingInfo[0].pricingExpression.usageUnit: expected {unit!r}, "
                              f"got {expression.get('usageUnit')!r}")
    rates = expression.get("tieredRates")
    if not isinstance(rates, list) or not rates:
        raise PriceParseError(f"{API}: {where}pricingInfo[0].pricingExpression.tieredRates: expected a non-empty list")
    price = dig(rates[-1], "unitPrice", api=API, where=f"{where}pricingInfo[0].pricingExpression.tieredRates[-1].")
    try:
        return Decimal(int(price.get("units") or 0)) * 10**9 + int(price.get("nanos") or 0)
    except (TypeError, ValueError, AttributeError):
        raise PriceParseError(f"{API}: {where}pricingInfo[0].pricingExpression.tieredRates[-1].unitPrice: "
                              f"expected {{units, nanos}}, got {price!r}") from None


def machine_nanos(row: CatalogRow, table: Table, usage: str) -> Decimal | None:
    """Core × vCPUs + RAM × GiB + GPU × count for the row in its region (None when a part is not priced)."""
    family = row.instance.split("-")[0].upper()
    parts = [(("core", family), Decimal(row.vcpus)), (("ram", family), Decimal(row.memory_mb) / 1024)]
    if row.gpu_count:
        gpu = GPU_NAMES.get((row.gpu_type, row.gpu_memory_gb)) or GPU_NAMES.get((row.gpu_type, None))
        if gpu is None:
            return None
        parts.append((("gpu", gpu.lower()), Decimal(row.gpu_count)))
    prices = [table.get((usage, row.region, *what)) for what, _ in parts]
    if any(p is None for p in prices):
        return None
    return sum((p * amount for p, (_, amount) in zip(prices, parts)), Decimal(0))
