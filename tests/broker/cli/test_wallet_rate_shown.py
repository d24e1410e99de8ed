"""A TAO/USD rate is shown with its source and time wherever a job's events are printed, and a stale one says so
(broker/cli/render.py; the rate's evidence is wallet/rates.py's `Rate.evidence`)."""

from __future__ import annotations

import asyncio

from trainmaster.broker.cli.render import _event_text
from trainmaster.wallet.rates import FixedRate, Rate


def _event(detail: dict) -> dict:
    return {"kind": "rate", "from": None, "to": None, "detail": detail}


def test_a_fresh_rate_shows_value_source_and_time():
    rate = asyncio.run(FixedRate(412_500_000, now=1_700_000_000.0).current())
    text = _event_text(_event({"at": "settle", **rate.evidence(3600, now=1_700_000_060.0)}), set())
    assert text.startswith("TAO rate at settle: $412.50 per TAO from fixed, taken ") and "STALE" not in text


def test_a_stale_rate_is_flagged():
    rate = Rate(micro_usd_per_tao=400_000_000, taken_at=1_700_000_000.0, source="https://rates.example/tao.json")
    evidence = rate.evidence(3600, now=1_700_000_000.0 + 3601)
    assert evidence["rate_stale"] is True and evidence["rate_source"] == "https://rates.example/tao.json"
    text = _event_text(_event({"at": "settle", **evidence}), set())
    assert "from https://rates.example/tao.json" in text and text.endswith("— STALE")
