"""The broker's TAO/USD rate provider (wallet/rates.py): a fixed rate or a file/URL source, each rate
with the time it was taken; stale ones flagged; a source that cannot be read says which and why, a URL within
its timeout (a real aiohttp server on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiohttp import web

from served_app import ServedApp

from trainmaster.wallet.rates import FixedRate, Rate, RateError, SourceRate, rate_provider


def test_a_fixed_rate_is_taken_when_the_provider_is_made():
    rate = asyncio.run(FixedRate(400_000_000, now=1000.0).current())
    assert (rate.micro_usd_per_tao, rate.taken_at, rate.source) == (400_000_000, 1000.0, "fixed")
    assert rate.micro_usd(10**9 + 1) == 400_000_001  # rounded up, in integers
    assert rate.evidence(60, now=1061.0) == {"micro_usd_per_tao": 400_000_000, "rate_at": 1000.0,
                                             "rate_source": "fixed", "rate_stale": True}
    assert not rate.stale(60, now=1059.0)


@pytest.mark.parametrize("as_url", [False, True])
def test_a_source_is_read_from_a_file_or_a_url(tmp_path, as_url):
    path = tmp_path / "rate.json"
    path.write_text(json.dumps({"micro_usd_per_tao": 321_000_000, "at": 5.0}))
    where = path.as_uri() if as_url else str(path)
    assert asyncio.run(SourceRate(where).current()) == Rate(micro_usd_per_tao=321_000_000, taken_at=5.0, source=where)


def test_a_bad_source_names_itself_and_never_echoes_its_bytes(tmp_path):
    path = tmp_path / "rate.json"
    path.write_text('{"price": "SECRET-BYTES"}')
    with pytest.raises(RateError) as caught:
        asyncio.run(SourceRate(str(path)).current())
    assert str(path) in str(caught.value) and "SECRET-BYTES" not in str(caught.value)
    with pytest.raises(RateError, match="cannot read the rate"):
        asyncio.run(SourceRate(str(tmp_path / "absent.json")).current())


def test_the_settings_pick_the_provider():
    assert rate_provider(None, None) is None
    assert isinstance(rate_provider(400_000_000, None), FixedRate)
    assert isinstance(rate_provider(400_000_000, "/x.json"), SourceRate)


@pytest.fixture
def rate_server():
    """/rate answers a rate, /broken 500, /huge more than 64 KiB, /stall nothing for 3 s."""

    async def rate(_):
        return web.json_response({"micro_usd_per_tao": 123_000_000, "at": 7.0})

    async def broken(_):
        return web.Response(status=500, text="down for maintenance")

    async def huge(_):
        return web.Response(body=b"{" + b" " * 100_000 + b"}")

    async def stall(_):
        await asyncio.sleep(3)
        return web.json_response({})

    app = web.Application()
    app.add_routes([web.get("/rate", rate), web.get("/broken", broken), web.get("/huge", huge), web.get("/stall", stall)])
    served = ServedApp(app)
    yield served.url
    served.stop()


def test_a_url_source_is_read_over_http_and_its_failures_say_why(rate_server):
    where = rate_server + "/rate"
    assert asyncio.run(SourceRate(where).current()) == Rate(micro_usd_per_tao=123_000_000, taken_at=7.0, source=where)
    with pytest.raises(RateError, match=r"/broken: cannot read the rate: HTTP 500"):
        asyncio.run(SourceRate(rate_server + "/broken").current())
    with pytest.raises(RateError, match=r"/huge: not a rate"):  # read up to 64 KiB only
        asyncio.run(SourceRate(rate_server + "/huge").current())
    began = time.monotonic()
    with pytest.raises(RateError, match=r"/stall: cannot read the rate: no answer within 0.5 s"):
        asyncio.run(SourceRate(rate_server + "/stall", timeout_s=0.5).current())
    assert time.monotonic() - began < 5  # bounded by the timeout
    with pytest.raises(RateError, match="cannot read the rate: "):  # nothing listens there
        asyncio.run(SourceRate("http://127.0.0.1:1/rate").current())
    with pytest.raises(RateError, match="a source is a file, or a file://, http:// or https:// URL"):
        asyncio.run(SourceRate("ftp://127.0.0.1/rate").current())
