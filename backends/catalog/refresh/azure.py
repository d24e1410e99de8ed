"""Azure's prices from the Retail Prices API (no authentication), one query per VM size and region.

`GET {endpoint}/api/retail/prices?$filter=serviceName eq 'Virtual Machines' and armSkuName eq '…' and
armRegionName eq '…'`, followed through `NextPageLink`. Of the `Items`, only hourly pay-as-you-go Linux
rows count (`type` Consumption, `unitOfMeasure` "1 Hour", no "Windows" in `productName`); a `skuName`
with "Low Priority" is Azure ML's low-priority price (the catalog's spot column), else one with "Spot".
"""

from __future__ import annotations

import asyncio
import os

from trainmaster.backends.catalog.load import CatalogRow
from trainmaster.backends.catalog.refresh.http import get_json, open_session
from trainmaster.backends.catalog.refresh.parse import PriceParseError, dig, micro_usd
from trainmaster.backends.catalog.refresh.write import Price

API = "Azure Retail Prices API"
ENDPOINT_ENV = "TRAINMASTER_AZURE_PRICES_ENDPOINT"
DEFAULT_ENDPOINT = "https://prices.azure.com"
SOURCE = (f"source: {API} ({DEFAULT_ENDPOINT}/api/retail/prices), Virtual Machines, Linux pay-as-you-go;\n"
          "spot_usd_per_hour: its Low Priority price (else Spot), else the shipped discount applied.")
MAX_PAGES = 50
CONCURRENT = 4


async def prices(rows: tuple[CatalogRow, ...]) -> dict[tuple[str, str], Price]:
    endpoint = os.environ.get(ENDPOINT_ENV, DEFAULT_ENDPOINT).rstrip("/")
    gate = asyncio.Semaphore(CONCURRENT)
    async with open_session() as session:
        async def one(row: CatalogRow):
            async with gate:
                return row.key, price(await _items(session, endpoint, row), row)

        found = await asyncio.gather(*(one(row) for row in rows))
    return {key: found_price for key, found_price in found if found_price is not None}


async def _items(session, endpoint: str, row: CatalogRow) -> list[dict]:
    url = f"{endpoint}/api/retail/prices"
    params = {"$filter": f"serviceName eq 'Virtual Machines' and armSkuName eq '{row.instance}' "
                         f"and armRegionName eq '{row.region}'"}
    items: list[dict] = []
    for page in range(MAX_PAGES):
        body = await get_json(session, url, api=API, params=params)
        found = dig(body, "Items", api=API, where=f"page {page + 1}: ")
        if not isinstance(found, list):
            raise PriceParseError(f"{API}: page {page + 1}: Items: expected a list")
        items += found
        url, params = body.get("NextPageLink"), None
        if not url:
            return items
        if not url.startswith(endpoint + "/"):
            raise PriceParseError(f"{API}: page {page + 1}: NextPageLink: points away from {endpoint}: {url}")
    raise PriceParseError(f"{API}: NextPageLink: more than {MAX_PAGES} pages for {row.instance} in {row.region}")


def price(items: list[dict], row: CatalogRow) -> Price | None:
    """The row's on-demand and spot prices from the API's items (None when none is an hourly Linux price)."""
    kinds: dict[str, list[int]] = {"on_demand": [], "low": [], "spot": []}
    for i, item in enumerate(items):
        where = f"Items[{i}]."
        if not isinstance(item, dict):
            raise PriceParseError(f"{API}: Items[{i}]: expected an object")
        if not _counts(item, row, where):
            continue
        sku = str(dig(item, "skuName", api=API, where=where))
        kind = "low" if "Low Priority" in sku else "spot" if "Spot" in sku else "on_demand"
        kinds[kind].append(micro_usd(dig(item, "retailPrice", api=API, where=where), api=API,
                                     field=f"{where}retailPrice"))
    kinds = {kind: [p for p in found if p > 0] for kind, found in kinds.items()}  # a free row is no VM's price
    if not kinds["on_demand"]:
        return None
    spot = kinds["low"] or kinds["spot"]
    return Price(on_demand=min(kinds["on_demand"]), spot=min(spot) if spot else None)


def _counts(item: dict, row: CatalogRow, where: str) -> bool:
    """Whether an item is an hourly pay-as-you-go Linux price of the row's size in the row's region."""
    return (dig(item, "type", api=API, where=where) == "Consumption"
            and dig(item, "unitOfMeasure", api=API, where=where) == "1 Hour"
            and "Windows" not in str(dig(item, "productName", api=API, where=where))
            and dig(item, "armSkuName", api=API, where=where) == row.instance
            and dig(item, "armRegionName", api=API, where=where) == row.region)
