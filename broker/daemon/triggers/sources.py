"""Counting new data for a trigger: files under a local folder, objects under a cloud prefix (the backends' object store that the URI names), Redis stream entries.

`observe(data, baseline)` returns how much is new against the baseline cursor (that of the last accepted run;
None before one, when everything present counts) and the cursor of what is there now, which the fire records.
A folder's or prefix's cursor is the set of names seen; a stream's is the id of its newest entry. A stream is
counted only up to the threshold (`XRANGE` from the cursor, exclusive, `COUNT min_new`), so a long backlog
costs no more than the threshold. The SDKs are imported here, inside the functions, and called off the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .model import Data

STREAM_START = "0-0"


class SourceUnavailable(RuntimeError):
    """The data could not be counted now (a server down, missing credentials); the trigger waits."""


@dataclass(frozen=True)
class Observation:
    new: int
    cursor: dict


async def observe(data: Data, baseline: dict | None, configs: Mapping[str, Any]) -> Observation:
    """What is new under `data` since `baseline`; `configs` are the backends' settings (backends.yaml)."""
    if data.folder is not None:
        return _names_since(await asyncio.to_thread(_folder_names, data.folder), baseline)
    if data.prefix is not None:
        return _names_since(await _prefix_names(data.prefix, configs), baseline)
    return await _stream_since(data, baseline)


def _names_since(names: set[str], baseline: dict | None) -> Observation:
    seen = set(baseline["names"]) if baseline else set()
    return Observation(new=len(names - seen), cursor={"names": sorted(names)})


def _folder_names(folder: Path) -> set[str]:
    if not folder.is_dir():
        raise SourceUnavailable(f"{folder} is not a folder")
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


async def _prefix_names(uri: str, configs: Mapping[str, Any]) -> set[str]:
    from trainmaster.backends.base import BackendError

    from trainmaster.backends.registry import store_for

    store = store_for(uri, configs)
    try:
        names = {o.key for o in await store.list("")}
        if not names and not await store.root_exists():  # an empty listing of a container that is not there
            raise SourceUnavailable(f"cannot list {uri}: {urlparse(uri).netloc} does not exist")
    except BackendError as exc:
        raise SourceUnavailable(f"cannot list {uri}: {exc}") from exc
    return names


async def _stream_since(data: Data, baseline: dict | None) -> Observation:
    import redis.asyncio as aioredis
    from redis.exceptions import RedisError

    start = baseline["last_id"] if baseline else STREAM_START
    client = aioredis.from_url(data.redis, socket_connect_timeout=5, socket_timeout=10)
    try:
        entries = await client.xrange(data.stream, min=f"({start}", max="+", count=data.min_new)
        newest = await client.xrevrange(data.stream, max="+", min="-", count=1)
    except RedisError as exc:
        raise SourceUnavailable(f"cannot read stream {data.stream!r} at {_safe(data.redis)}: {exc}") from exc
    finally:
        await client.aclose()
    last = _text(newest[0][0]) if newest else start
    return Observation(new=len(entries), cursor={"last_id": last})


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _safe(url: str) -> str:
    """The URL without its password, for messages."""
    parsed = urlparse(url)
    return parsed._replace(netloc=f"{parsed.hostname}:{parsed.port}" if parsed.port else str(parsed.hostname)).geturl()
