"""Local stand-ins for the three price APIs, replaying the recorded answers under tests/data/prices/.

Strict: an unknown route, operation, query parameter or filter is refused (400/404). Each fake answers the
statuses queued in `faults` (status, body) first, one per request, then the recorded data, paged small so that
every fetcher follows several pages. `requests` logs what was asked.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from aiohttp import web

DATA = Path(__file__).parent / "data" / "prices"


class Fake:
    def __init__(self):
        self.faults: list[tuple[int, str]] = []
        self.requests: list[str] = []
        self.app = web.Application(middlewares=[self._fault])

    @web.middleware
    async def _fault(self, request, handler):
        self.requests.append(str(request.rel_url))
        if self.faults:
            status, body = self.faults.pop(0)
            return web.Response(status=status, text=body, content_type=self.content_type)
        return await handler(request)


class FakeAwsPricing(Fake):
    """JSON 1.1 `AWSPriceListService.GetProducts`: TERM_MATCH filters on product attributes, NextToken paging."""
    content_type = "application/x-amz-json-1.1"
    PAGE = 2

    def __init__(self):
        super().__init__()
        self.products = json.loads((DATA / "aws_sagemaker_products.json").read_text())
        self.app.router.add_post("/", self.handle)

    async def handle(self, request):
        target = request.headers.get("X-Amz-Target", "")
        body = await request.json()
        if target != "AWSPriceListService.GetProducts" or set(body) - {"ServiceCode", "Filters", "FormatVersion",
                                                                        "NextToken", "MaxResults"}:
            return self.error("InvalidParameterException", f"unsupported request {target} {sorted(body)}")
        if body.get("ServiceCode") != "AmazonSageMaker":
            return self.error("InvalidParameterException", f"unknown service {body.get('ServiceCode')}")
        matching = [p for p in self.products if all(self.matches(p, f) for f in body.get("Filters", []))]
        start = int(body.get("NextToken") or 0)
        answer = {"FormatVersion": "aws_v1", "PriceList": [json.dumps(p) for p in matching[start:start + self.PAGE]]}
        if start + self.PAGE < len(matching):
            answer["NextToken"] = str(start + self.PAGE)
        return web.json_response(answer, content_type=self.content_type)

    @staticmethod
    def matches(product: dict, term: dict) -> bool:
        if term.get("Type") != "TERM_MATCH" or set(term) != {"Type", "Field", "Value"}:
            raise web.HTTPBadRequest(text=f"unsupported filter {term}")
        return product["product"]["attributes"].get(term["Field"]) == term["Value"]

    def error(self, kind: str, message: str):
        return web.Response(status=400, text=json.dumps({"__type": kind, "message": message}),
                            content_type=self.content_type)


class FakeCloudBilling(Fake):
    """`GET /v1/services/{id}/skus`, the recorded pages in order, by `pageToken`."""
    content_type = "application/json"

    def __init__(self):
        super().__init__()
        self.pages = json.loads((DATA / "gcp_vertex_skus_pages.json").read_text())
        self.app.router.add_get("/v1/services/C7E2-9256-1C43/skus", self.handle)

    async def handle(self, request):
        query = request.query
        if set(query) - {"currencyCode", "pageSize", "pageToken", "key"} or query.get("currencyCode") != "USD":
            return web.json_response({"error": {"code": 400, "message": f"bad query {dict(query)}"}}, status=400)
        index = 0 if not query.get("pageToken") else [p["nextPageToken"] for p in self.pages].index(query["pageToken"]) + 1
        return web.json_response(self.pages[index])


class FakeRetailPrices(Fake):
    """`GET /api/retail/prices?$filter=serviceName eq … and armSkuName eq … and armRegionName eq …`, `$skip` paging."""
    content_type = "application/json"
    PAGE = 2
    FILTER = re.compile(r"serviceName eq 'Virtual Machines' and armSkuName eq '([\w]+)' and armRegionName eq '(\w+)'")

    def __init__(self):
        super().__init__()
        self.items = json.loads((DATA / "azure_retail_items.json").read_text())
        self.app.router.add_get("/api/retail/prices", self.handle)

    async def handle(self, request):
        query = request.query
        match = self.FILTER.fullmatch(query.get("$filter", ""))
        if set(query) - {"$filter", "$skip"} or match is None:
            return web.json_response({"Error": {"Code": "BadRequest", "Message": f"bad query {dict(query)}"}}, status=400)
        size, region = match.groups()
        found = [i for i in self.items if i["armSkuName"] == size and i["armRegionName"] == region]
        skip = int(query.get("$skip", 0))
        link = None
        if skip + self.PAGE < len(found):
            link = str(request.url.with_query({"$filter": query["$filter"], "$skip": str(skip + self.PAGE)}))
        return web.json_response({"BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail",
                                  "Items": found[skip:skip + self.PAGE], "NextPageLink": link, "Count": len(found)})
