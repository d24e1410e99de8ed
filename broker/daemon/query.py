"""Query values of the daemon's API, checked: a malformed one is a 400 naming the parameter, never a 500.

`?limit=abc`, `?offset=1e20`, `?offset=-5`, `?all=maybe` are the caller's mistakes; each answer says what the
parameter takes.
"""

from __future__ import annotations

import json

from aiohttp import web

MAX_OFFSET = 2**62
"""The largest log offset taken (a file position; larger ones are no position any log has)."""


def bad_request(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=json.dumps({"error": message}), content_type="application/json")


def integer(request: web.Request, name: str, default: int, *, low: int, high: int) -> int:
    """The parameter `name` as a whole number in [low, high]; `default` when absent."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 20:
        raise bad_request(f"{name}: a whole number from {low} to {high} is required, not {raw[:40]!r}")
    value = int(raw)
    if not low <= value <= high:
        raise bad_request(f"{name}: a whole number from {low} to {high} is required, not {raw[:40]!r}")
    return value


def flag(request: web.Request, name: str) -> bool:
    """The parameter `name` as a yes/no: 1/true/yes or 0/false/no (absent: no)."""
    raw = request.query.get(name)
    if raw is None or raw.lower() in ("", "0", "false", "no"):
        return False
    if raw.lower() in ("1", "true", "yes"):
        return True
    raise bad_request(f"{name}: 1 or 0 is required, not {raw[:40]!r}")


def text(request: web.Request, name: str, *, max_length: int = 256) -> str | None:
    """The parameter `name` as text of at most `max_length` characters (None when absent)."""
    raw = request.query.get(name)
    if raw is not None and len(raw) > max_length:
        raise bad_request(f"{name}: at most {max_length} characters")
    return raw
