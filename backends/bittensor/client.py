"""The broker's calls to one miner: every request signed with the broker's hotkey for the miner's hotkey
as receiver (btauth/1, a fresh nonce each time, so a retry is signed again), a timeout on every call,
answers read up to protocol.MAX_JSON_BYTES and validated as the protocol's model, and the miner's
failures as the broker's typed errors (broker/failures.py reacts to each):

| what happened                                    | error                 |
|--------------------------------------------------|-----------------------|
| connection refused or dropped, a timeout, a 5xx  | TransientBackendError |
| 503, 413 (it cannot take this job now)           | CapacityError         |
| an answer too large, not JSON, not the model     | ExecutorFault         |
| 404 for an attempt it accepted                   | ExecutorFault         |
| 401 (our signature refused), 403, other 4xx      | BackendError          |
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import TypeVar
from urllib.parse import quote

import aiohttp
from pydantic import BaseModel, ValidationError

from trainmaster.backends.base import (
    BackendError, CapacityError, ExecutorFault, TransientBackendError,
)
from trainmaster.backends.bittensor import auth, protocol
from trainmaster.backends.bittensor.directory import Miner

T = TypeVar("T", bound=BaseModel)
CALL_TIMEOUT = aiohttp.ClientTimeout(total=60, sock_connect=5)
STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=60)
CHUNK = 1 << 16


class MinerClient:
    """Signed JSON calls and byte streams to `miner`, as `signer` (the broker's hotkey keypair)."""

    def __init__(self, miner: Miner, signer, *, timeout: aiohttp.ClientTimeout = CALL_TIMEOUT):
        self.miner, self.signer, self.timeout = miner, signer, timeout

    @property
    def who(self) -> str:
        return f"miner {self.miner.hotkey[:8]}…"

    def _signed(self, method: str, target: str, body: bytes) -> dict[str, str]:
        return auth.sign(self.signer, method=method, path=target, body=body, receiver=self.miner.hotkey)

    async def answer(self, model: type[T], method: str, target: str, body: BaseModel | None = None) -> T:
        """The miner's answer to one signed call, as `model`."""
        got = await self.call(method, target, body)
        try:
            return model.model_validate(got)
        except ValidationError as exc:
            raise ExecutorFault(f"{self.who}: {_route(target)}: not a valid {model.__name__} of the protocol "
                                f"({exc.error_count()} errors)") from None

    async def call(self, method: str, target: str, body: BaseModel | None = None, *, data=None) -> dict:
        """A signed request and its answer as a JSON object. `data` (an async byte stream) is sent as the
        body of a request signed over an empty body (the bundle upload, bound by the sha256 in its path)."""
        raw = b"" if body is None else body.model_dump_json().encode()
        kind = "application/octet-stream" if data is not None else "application/json"
        headers = {**self._signed(method, target, raw), "Content-Type": kind}
        try:
            async with aiohttp.ClientSession(timeout=self.timeout) as session:
                async with session.request(method, self._url(target), data=data if data is not None else raw,
                                           headers=headers) as r:
                    text = await _bounded(r, self.who, target)
                    _raise_for(r.status, text, self.who, target)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as exc:
            raise TransientBackendError(f"{self.who} at {self.miner.url} is unreachable: "
                                        f"{type(exc).__name__} {exc}".rstrip()) from None
        return _json_object(text, self.who, target)

    def reader(self, target: str, size: int | None = None):
        """`read(offset)` for `transfer.download`: the bytes of `target` from `offset` on (`Range`).

        With `size` (the file's announced size), an answer the miner completed — its framing whole: every byte of
        its Content-Length, or its last chunk — that holds fewer bytes than the rest of the file is the miner's
        statement, not a network fault (ExecutorFault), as is a partial answer whose Content-Range is not the
        range asked for or whose length differs from that range. A stream cut short (the connection dropped or
        timed out) ends the read: `download` says how much is missing, and resumes on a retry."""

        async def read(offset: int) -> AsyncIterator[bytes]:
            headers = {**self._signed("GET", target, b""), "Range": f"bytes={offset}-"}
            got = 0
            try:
                async with aiohttp.ClientSession(timeout=STREAM_TIMEOUT) as session:
                    async with session.get(self._url(target), headers=headers) as r:
                        if r.status not in (200, 206):
                            _raise_for(r.status, await _bounded(r, self.who, target), self.who, target)
                        if offset and r.status != 206:
                            raise ExecutorFault(f"{self.who}: {_route(target)}: a range from byte {offset} "
                                                f"was answered with the whole file")
                        if size is not None:
                            _check_framing(r, offset, size, self.who, target)
                        async for chunk in r.content.iter_chunked(CHUNK):
                            got += len(chunk)
                            yield chunk
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError):
                return  # a stream cut short: `download` says how much is missing, and resumes on a retry
            if size is not None and offset + got < size:
                raise ExecutorFault(f"{self.who}: {_route(target)}: its answer ended whole after {offset + got:,} of "
                                    f"the {size:,} bytes it announced")

        return read

    def _url(self, target: str) -> str:
        return self.miner.url + target  # `target` is in the form aiohttp sends as it is (see `target`)


def _check_framing(r: aiohttp.ClientResponse, offset: int, size: int, who: str, target: str) -> None:
    """The answer's own framing against the range asked (`offset` on, of a file announced at `size` bytes)."""
    if r.status == 206:
        asked = f"bytes {offset}-{size - 1}/{size}"
        said = r.headers.get("Content-Range", "")
        if said.strip() != asked:
            raise ExecutorFault(f"{who}: {_route(target)}: answered the range from byte {offset} with Content-Range "
                                f"{said[:80]!r}, not {asked!r}")
    if r.content_length is not None and r.content_length != size - offset:
        raise ExecutorFault(f"{who}: {_route(target)}: its answer announces {r.content_length:,} bytes for the "
                            f"{size - offset:,} left of the {size:,} it announced")


PATH_SAFE = "/!$&'()*+,;=:@"
"""What a file's path keeps unencoded in a target: its slashes and the characters RFC 3986 allows in a path
segment, which aiohttp (yarl) would otherwise decode, so that the target sent is the target signed."""


def target(template: str, query: dict[str, int] | None = None, **values: str) -> str:
    """The request target of a route, as it is signed and sent: placeholders filled (a file's path
    percent-encoded but for PATH_SAFE) and an integer query appended."""
    filled = protocol.route(template, **{k: quote(v, safe=PATH_SAFE if k == "path" else "") for k, v in values.items()})
    return filled + ("?" + "&".join(f"{k}={int(v)}" for k, v in query.items()) if query else "")


async def _bounded(response: aiohttp.ClientResponse, who: str, target: str) -> str:
    """The whole answer, read to its end (one `read(n)` returns only what has arrived), but never more than
    protocol.MAX_JSON_BYTES: past that it is the miner's fault."""
    raw, size = [], 0
    async for chunk in response.content.iter_chunked(CHUNK):
        size += len(chunk)
        if size > protocol.MAX_JSON_BYTES:
            raise ExecutorFault(f"{who}: {_route(target)}: an answer larger than {protocol.MAX_JSON_BYTES} bytes")
        raw.append(chunk)
    return b"".join(raw).decode("utf-8", errors="replace")


def _json_object(text: str, who: str, target: str) -> dict:
    try:
        got = json.loads(text)
    except (ValueError, RecursionError):
        raise ExecutorFault(f"{who}: {_route(target)}: the answer is not JSON") from None
    if not isinstance(got, dict):
        raise ExecutorFault(f"{who}: {_route(target)}: the answer is not a JSON object")
    return got


class QuoteUsed(BackendError):
    """The miner refused a dispatch because its quote already bought an attempt (a retry on the same offer)."""


def _raise_for(status: int, text: str, who: str, target: str) -> None:
    if status < 400:
        return
    reason = _reason(text, status)
    said = f"{who} refused {_route(target)} ({status} {reason})"
    if status == 409 and reason == protocol.QUOTE_USED:
        raise QuoteUsed(said)
    if status in (503, 413):
        raise CapacityError(f"{said}: it cannot take this job now")
    if status >= 500:
        raise TransientBackendError(f"{who} failed on {_route(target)} ({status} {reason})")
    if status == 401:
        raise BackendError(f"{said}: our signed request was not accepted, which is not counted against it"
                           + (": this machine's clock (or the miner's) is off by more than "
                              f"{auth.MAX_AGE_S:g} s; check NTP" if reason == "StaleRequest" else ""))
    if status == 403:
        raise BackendError(f"{said}: it does not serve our hotkey")
    if status == 404 and "/attempts/" in target:
        raise ExecutorFault(f"{said}: it no longer knows an attempt it accepted")
    raise BackendError(said)


def _reason(text: str, status: int) -> str:
    try:
        reason = json.loads(text).get("error")
    except (ValueError, AttributeError, RecursionError):
        reason = None
    return "".join(c for c in str(reason or f"HTTP {status}")[:300] if c.isprintable())


def _route(target: str) -> str:
    return target.split("?", 1)[0][:200]
