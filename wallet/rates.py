"""The TAO/USD exchange rate the broker prices and settles TAO work with, and where it comes from.

The broker owns one rate provider per policy (`rate_provider`) and hands it to the backends that
quote or charge in TAO: a fixed rate the user configured, or a source (a file, or a URL) holding
`{"micro_usd_per_tao": N, "at": UNIX_TIME}`. Every rate carries the time it was taken, so an offer's
quote and an attempt's charge record both, and a rate older than the policy's `max_age_s` is
flagged as stale wherever it is recorded. `current()` is a coroutine: a URL is read over aiohttp (the project's
one HTTP client library), within URL_TIMEOUT_S, on the caller's loop, never blocking it.
"""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field

RAO_PER_TAO = 10**9
URL_TIMEOUT_S = 5.0
MAX_BYTES = 65536


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

    async def current(self) -> Rate:
        raise NotImplementedError


class FixedRate(RateProvider):
    """A rate the user configured: taken when the provider was made (each plan makes one)."""

    def __init__(self, micro_usd_per_tao: int, *, now: float | None = None):
        self.rate = Rate(micro_usd_per_tao=micro_usd_per_tao, taken_at=now if now is not None else time.time(),
                         source="fixed")

    async def current(self) -> Rate:
        return self.rate


class SourceRate(RateProvider):
    """A rate read from a file path or a URL (file://, http://, https://) holding `{"micro_usd_per_tao", "at"}`."""

    def __init__(self, location: str, *, timeout_s: float = URL_TIMEOUT_S):
        self.location, self.timeout_s = location, timeout_s

    async def current(self) -> Rate:
        raw = await self._read()
        try:
            data = json.loads(raw)
            return Rate(micro_usd_per_tao=data["micro_usd_per_tao"], taken_at=data["at"], source=self.location)
        except (ValueError, KeyError, TypeError) as exc:
            raise RateError(f"{self.location}: not a rate ({type(exc).__name__}); expected "
                            '{"micro_usd_per_tao": integer, "at": unix time}') from None

    async def _read(self) -> bytes:
        url = urlsplit(self.location) if "://" in self.location else None
        if url is None or url.scheme == "file":
            if url is not None and url.netloc not in ("", "localhost"):
                raise RateError(f"{self.location}: cannot read the rate: a file:// URL names this machine's files only")
            return self._read_file(unquote(url.path) if url is not None else self.location)
        if url.scheme not in ("http", "https"):
            raise RateError(f"{self.location}: cannot read the rate: a source is a file, or a file://, http:// or "
                            "https:// URL")
        return await self._get()

    def _read_file(self, path: str) -> bytes:
        """A regular file of at most 64 KiB (never a FIFO's wait, /dev/zero's end)."""
        from trainmaster.jobs.userfile import read_user_file

        try:
            return read_user_file(path, MAX_BYTES)
        except OSError as exc:
            raise RateError(f"{self.location}: cannot read the rate: {exc.strerror or exc}") from None

    async def _get(self) -> bytes:
        """The URL's body (at most 64 KiB), within `timeout_s` in all."""
        import aiohttp

        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as session:
                async with session.get(self.location) as response:
                    if response.status >= 400:
                        raise RateError(f"{self.location}: cannot read the rate: HTTP {response.status} "
                                        f"{response.reason or ''}".rstrip())
                    body = bytearray()
                    async for chunk in response.content.iter_chunked(1 << 14):
                        body += chunk
                        if len(body) >= MAX_BYTES:
                            break
                    return bytes(body[:MAX_BYTES])
        except asyncio.TimeoutError:
            raise RateError(f"{self.location}: cannot read the rate: no answer within {self.timeout_s:g} s") from None
        except (aiohttp.ClientError, OSError) as exc:
            why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise RateError(f"{self.location}: cannot read the rate: {why}") from None


def rate_provider(micro_usd_per_tao: int | None, source: str | None) -> RateProvider | None:
    """The provider the settings name (a source wins over a fixed rate); None when neither is set."""
    if source:
        return SourceRate(source)
    if micro_usd_per_tao:
        return FixedRate(micro_usd_per_tao)
    return None
