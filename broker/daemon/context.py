"""What the daemon's request handlers share, kept on the aiohttp application under `CTX`."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web


@dataclass
class DaemonContext:
    """What the handlers share: the token's sha256, the API's broker, the reconciler, and facts for /health."""

    token_digest: str
    api_broker: object
    reconciler: object
    started_at: float
    address: str = ""
    passes: int = 0


CTX = web.AppKey("ctx", DaemonContext)
