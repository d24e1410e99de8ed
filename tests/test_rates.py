"""The broker's TAO/USD rate provider (wallet/rates.py): a fixed rate or a file/URL source, each rate
with the time it was taken; stale ones flagged; a source that cannot be read says which and why."""

from __future__ import annotations

import json

import pytest

from trainmaster.wallet.rates import FixedRate, Rate, RateError, SourceRate, rate_provider


def test_a_fixed_rate_is_taken_when_the_provider_is_made():
    rate = FixedRate(400_000_000, now=1000.0).current()
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
    assert SourceRate(where).current() == Rate(micro_usd_per_tao=321_000_000, taken_at=5.0, source=where)


def test_a_bad_source_names_itself_and_never_echoes_its_bytes(tmp_path):
    path = tmp_path / "rate.json"
    path.write_text('{"price": "SECRET-BYTES"}')
    with pytest.raises(RateError) as caught:
        SourceRate(str(path)).current()
    assert str(path) in str(caught.value) and "SECRET-BYTES" not in str(caught.value)
    with pytest.raises(RateError, match="cannot read the rate"):
        SourceRate(str(tmp_path / "absent.json")).current()


def test_the_settings_pick_the_provider():
    assert rate_provider(None, None) is None
    assert isinstance(rate_provider(400_000_000, None), FixedRate)
    assert isinstance(rate_provider(400_000_000, "/x.json"), SourceRate)
