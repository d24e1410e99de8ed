"""SageMaker's training prices from the AWS Price List API (boto3's `pricing` client), one query per row.

`get_products(ServiceCode="AmazonSageMaker", Filters=[instanceName, regionCode])`, paginated; each
`PriceList` item is a JSON *string*. SageMaker lists hosting, notebook and training prices for an instance:
only a product whose `usagetype` names training ("…-Train:ml.g5.xlarge", not "…Spot…") counts, priced from
`terms.OnDemand.*.priceDimensions.*.pricePerUnit.USD` where `unit` is "Hrs". The Price List API has no spot
prices (managed spot bills EC2's moving spot price), so the spot column keeps the shipped discount.
The endpoint is the Price List API's in us-east-1, or `TRAINMASTER_AWS_PRICING_ENDPOINT`; calls are signed
with boto3's usual credentials.
"""

from __future__ import annotations

import asyncio
import json
import os

from trainmaster.backends.base import BackendError, TransientBackendError
from trainmaster.backends.catalog.load import CatalogRow
from trainmaster.backends.catalog.refresh.parse import PriceParseError, dig, micro_usd
from trainmaster.backends.catalog.refresh.write import Price
from trainmaster.backends.retry import retried

API = "AWS Price List API"
ENDPOINT_ENV = "TRAINMASTER_AWS_PRICING_ENDPOINT"
SOURCE = (f"source: {API} (pricing.get_products, ServiceCode AmazonSageMaker, us-east-1), training usage types;\n"
          "spot_usd_per_hour: NOT fetched (the API has no spot prices): the shipped spot discount applied.")
CONCURRENT = 4
THROTTLED = {"Throttling", "ThrottlingException", "TooManyRequestsException", "RequestLimitExceeded"}


async def prices(rows: tuple[CatalogRow, ...]) -> dict[tuple[str, str], Price]:
    client = await asyncio.to_thread(_client)
    gate = asyncio.Semaphore(CONCURRENT)

    async def one(row: CatalogRow):
        async with gate:
            products = await retried(asyncio.to_thread, _products, client, row)
            return row.key, price(products, row)

    found = await asyncio.gather(*(one(row) for row in rows))
    return {key: found_price for key, found_price in found if found_price is not None}


def _client():
    from botocore.config import Config

    from trainmaster.backends.aws.sdk import boto3

    config = Config(retries={"total_max_attempts": 1}, connect_timeout=5, read_timeout=30)
    return boto3().client("pricing", region_name="us-east-1", endpoint_url=os.environ.get(ENDPOINT_ENV) or None,
                          config=config)


def _products(client, row: CatalogRow) -> list[dict]:
    """Every product the API lists for the row's instance and region, each parsed from its JSON string."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    filters = [{"Type": "TERM_MATCH", "Field": "instanceName", "Value": row.instance},
               {"Type": "TERM_MATCH", "Field": "regionCode", "Value": row.region}]
    try:
        pages = client.get_paginator("get_products").paginate(ServiceCode="AmazonSageMaker", Filters=filters,
                                                              FormatVersion="aws_v1")
        items = [item for page in pages for item in page.get("PriceList", [])]
    except NoCredentialsError:
        raise BackendError(f"{API}: no AWS credentials (its calls are signed): set AWS_PROFILE or "
                           "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY") from None
    except ClientError as exc:
        raise _client_error(exc) from None
    except BotoCoreError as exc:
        raise TransientBackendError(f"{API}: {exc}") from None
    return [_product(item, i) for i, item in enumerate(items)]


def _client_error(exc) -> BackendError:
    error = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    message = f"{API}: {error.get('Code', 'error')}: {error.get('Message', str(exc))}"
    return TransientBackendError(message) if error.get("Code") in THROTTLED or status >= 500 else BackendError(message)


def _product(item, i: int) -> dict:
    try:
        product = json.loads(item)
    except (TypeError, ValueError):
        raise PriceParseError(f"{API}: PriceList[{i}]: expected a JSON string") from None
    if not isinstance(product, dict):
        raise PriceParseError(f"{API}: PriceList[{i}]: expected a JSON object")
    return product


def price(products: list[dict], row: CatalogRow) -> Price | None:
    """The row's on-demand training price (None when no product is its hourly training price)."""
    found = set()
    for i, product in enumerate(products):
        where = f"PriceList[{i}]."
        attributes = dig(product, "product.attributes", api=API, where=where)
        usage = str(attributes.get("usagetype", ""))
        if ("Train" not in usage or "spot" in usage.lower() or attributes.get("instanceName") != row.instance
                or attributes.get("regionCode") != row.region):
            continue
        found |= _hourly(dig(product, "terms.OnDemand", api=API, where=where), where)
    return Price(on_demand=min(found)) if found else None


def _hourly(on_demand: dict, where: str) -> set[int]:
    """The USD prices of the hourly price dimensions of a product's on-demand terms."""
    hourly = set()
    for term_key, term in on_demand.items():
        for key, dimension in dig(term, "priceDimensions", api=API, where=f"{where}terms.OnDemand.{term_key}.").items():
            field = f"{where}terms.OnDemand.{term_key}.priceDimensions.{key}."
            if dig(dimension, "unit", api=API, where=field) == "Hrs":
                usd = dig(dimension, "pricePerUnit.USD", api=API, where=field)
                hourly.add(micro_usd(usd, api=API, field=f"{field}pricePerUnit.USD"))
    return hourly - {0}  # a free dimension (a trial) is not the instance's price
