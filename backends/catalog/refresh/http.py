"""GET a price API's JSON over aiohttp: bounded time, retried on 429/5xx/dropped connections, typed errors.

429, 5xx, timeouts and refused connections are TransientBackendError (retried with jitter by
`backends.retry`, then raised); any other 4xx is a BackendError quoting the API's own message; a body
that is not JSON is a PriceParseError.
"""

from __future__ import annotations

import asyncio
import json

from trainmaster.backends.base import BackendError, TransientBackendError
from trainmaster.backends.catalog.refresh.parse import PriceParseError
from trainmaster.backends.retry import retried

TIMEOUT_S = 30
CONNECT_TIMEOUT_S = 5


async def get_json(session, url: str, *, api: str, params: dict | None = None, headers: dict | None = None) -> dict:
    """The JSON object `url` answers, tried again on transient failures."""
    return await retried(_get_once, session, url, api=api, params=params, headers=headers)


def open_session():
    """An aiohttp session with the fetchers' timeouts."""
    import aiohttp

    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S, sock_connect=CONNECT_TIMEOUT_S))


async def _get_once(session, url: str, *, api: str, params: dict | None, headers: dict | None) -> dict:
    import aiohttp

    try:
        async with session.get(url, params=params, headers=headers) as response:
            text = await response.text()
            status = response.status
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as exc:
        raise TransientBackendError(f"{api}: cannot reach {url.split('?')[0]}: {exc or type(exc).__name__}") from None
    if status == 429 or status >= 500:
        raise TransientBackendError(f"{api}: HTTP {status}: {api_message(text)}")
    if status >= 400:
        raise BackendError(f"{api}: HTTP {status}: {api_message(text)}")
    return parse_object(text, api)


def parse_object(text: str, api: str) -> dict:
    """`text` as a JSON object, or PriceParseError."""
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise PriceParseError(f"{api}: the answer is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise PriceParseError(f"{api}: the answer is not a JSON object")
    return body


def api_message(text: str) -> str:
    """The error message inside an API's answer ({"error": {"message"}}, {"Error": {"Message"}}, ...), else the text."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:300] or "(empty answer)"
    error = (body.get("error") or body.get("Error") or body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        for key in ("message", "Message"):
            if isinstance(error.get(key), str):
                return error[key][:300]
    return text.strip()[:300]
