"""The TAO/USD exchange rate the broker prices and settles TAO work with, and where it comes from.

The broker owns one rate provider per policy (`rate_provider`) and hands it to the backends that
quote or charge in TAO: a fixed rate the user configured, or a source (a file, or a URL) holding
`{"micro_usd_per_tao": N, "at": UNIX_TIME}`. Every rate carries the time it was taken, so an offer's
quote and an attempt's charge record both, and a rate older than the policy's `max_age_s` is
flagged as stale wherever it is recorded.
"""

from __future__ import annotations

import json
import time
import urllib.request

from pydantic import BaseModel, ConfigDict, Field

RAO_PER_TAO = 10**9
URL_TIMEOUT_S = 5.0


class Rate(BaseModel):
    """Micro-USD per TAO, when it was taken, and from where."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    micro_usd_per_tao: int = Field(gt=0)
    taken_at: float = Field(description="Unix time the rate was taken.")
    source: str = Field(description="Where it came from: 'fixed', a file path or a URL.")

    def stale(self, max_age_s: float, now: float | None = None) -> bool:
        """Whether the rate is older than `max_age_s` at `now`."""
        return (now if now is not None else time.time()) - self.taken_at > max_age_s

    def micro_usd(self, rao: int) -> int:
        """`rao` in micro-USD at this rate, rounded up (integers throughout)."""
        return -(-rao * self.micro_usd_per_tao // RAO_PER_TAO)

    def evidence(self, max_age_s: float, now: float | None = None) -> dict:
        """What a quote or a charge records of the rate it used."""
        return {"micro_usd_per_tao": self.micro_usd_per_tao, "rate_at": self.taken_at, "rate_source": self.source,
                "rate_stale": self.stale(max_age_s, now)}


class RateError(RuntimeError):
    """The rate source could not be read or does not hold a rate; the message names it and why."""


class RateProvider:
    """Gives the current rate; `fixed` and `source` are the two kinds."""

    def current(self) -> Rate:
        raise NotImplementedError


class FixedRate(RateProvider):
    """A rate the user configured: taken when the provider was made (each plan makes one)."""

    def __init__(self, micro_usd_per_tao: int, *, now: float | None = None):
        self.rate = Rate(micro_usd_per_tao=micro_usd_per_tao, taken_at=now if now is not None else time.time(),
                         source="fixed")

    def current(self) -> Rate:
        return self.rate


class SourceRate(RateProvider):
    """A rate read from a file path or a URL (file://, https://) holding `{"micro_usd_per_tao", "at"}`."""

    def __init__(self, location: str):
        self.location = location

    def current(self) -> Rate:
        raw = self._read()
        try:
            data = json.loads(raw)
            return Rate(micro_usd_per_tao=data["micro_usd_per_tao"], taken_at=data["at"], source=self.location)
        except (ValueError, KeyError, TypeError) as exc:
            raise RateError(f"{self.location}: not a rate ({type(exc).__name__}); expected "
                            '{"micro_usd_per_tao": integer, "at": unix time}') from None

    def _read(self) -> bytes:
        try:
            if "://" not in self.location:  # a regular file of at most 64 KiB (never a FIFO's wait, /dev/zero's end)
                from trainmaster.jobs.userfile import read_user_file

                return read_user_file(self.location, 65536)
            with urllib.request.urlopen(self.location, timeout=URL_TIMEOUT_S) as response:  # noqa: S310 — the user's own source
                return response.read(65536)
        except OSError as exc:
            raise RateError(f"{self.location}: cannot read the rate: {exc.strerror or exc}") from None


def rate_provider(micro_usd_per_tao: int | None, source: str | None) -> RateProvider | None:
    """The provider the settings name (a source wins over a fixed rate); None when neither is set."""
    if source:
        return SourceRate(source)
    if micro_usd_per_tao:
        return FixedRate(micro_usd_per_tao)
    return None
