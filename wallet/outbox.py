"""At-least-once delivery of budget alerts to their webhooks.

The ledger records each alert, with its webhook and payload, in ``ledger_alerts`` inside the
transaction that crossed the threshold, so it exists exactly once. Delivery comes afterwards: a
background thread POSTs every undelivered alert, retrying with jittered exponential backoff, and
marks it delivered on a 2xx answer. An alert that still fails stays pending, and the next process
that opens the ledger tries again (at most :data:`MAX_FLUSHES` times), so a webhook that was down
gets its alert once it is back. A receiver may see an alert twice (two processes flushing at once,
or a crash between the POST and the mark); the payload's ``id`` lets it drop the repeat.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
import time
from pathlib import Path

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from trainmaster.storage import statedb
from trainmaster.wallet import alert_records
from trainmaster.wallet.alerts import redact_urls

log = logging.getLogger("trainmaster.wallet.alerts")

MAX_FLUSHES = 10
"""Flushes (each up to :data:`POST_ATTEMPTS` POSTs) an alert gets before it is given up."""
POST_ATTEMPTS = 3
TIMEOUT_S = 3.0
_flushing: dict[str, threading.Lock] = {}
_flushing_guard = threading.Lock()


class WebhookRefused(Exception):
    """The webhook answered, but not with a 2xx."""

    def __init__(self, status: int):
        super().__init__(f"HTTP {status}")
        self.status = status




def has_pending(db: sqlite3.Connection) -> bool:
    """Whether the ledger on ``db`` holds alerts still to deliver."""
    return alert_records.has_pending(db, MAX_FLUSHES)


def flush(path: Path | str) -> int:
    """POST every pending alert in the ledger at ``path``; returns how many were delivered."""
    with _lock_for(path):
        db = statedb.connect(path)
        try:
            delivered = 0
            for budget, period_start, percent, url, payload in alert_records.pending(db, MAX_FLUSHES):
                ok = _post_with_retries(url, json.loads(payload))
                alert_records.tried(db, budget, period_start, percent, time.time() if ok else None)
                delivered += ok
            return delivered
        finally:
            db.close()


def flush_in_background(path: Path | str) -> threading.Thread:
    """:func:`flush` on a thread that is not a daemon: a short-lived CLI waits for it before exiting."""
    thread = threading.Thread(target=_flush_logged, args=(path,), name="budget-alerts")
    thread.start()
    return thread


def _flush_logged(path: Path | str) -> None:
    try:
        flush(path)
    except Exception as exc:  # delivery must never break anything else
        log.error(redact_urls(f"budget alerts could not be delivered: {exc}"))


def _lock_for(path: Path | str) -> threading.Lock:
    with _flushing_guard:
        return _flushing.setdefault(path if statedb.is_server(path) else str(Path(path).resolve()), threading.Lock())


def _post_with_retries(url: str, payload: dict) -> bool:
    retrying = Retrying(
        stop=stop_after_attempt(POST_ATTEMPTS),
        wait=wait_random_exponential(multiplier=0.2, max=2.0),
        retry=retry_if_exception_type((OSError, asyncio.TimeoutError, WebhookRefused, _client_error())),
        reraise=True,
    )
    try:
        for attempt in retrying:
            with attempt:
                status = asyncio.run(post_json(url, payload))
                if status >= 300:
                    raise WebhookRefused(status)
    except Exception as exc:
        log.error(redact_urls(f"budget alert webhook {url} failed after {POST_ATTEMPTS} tries: {exc} "
                              "(kept; retried by the next process)"))
        return False
    return True


async def post_json(url: str, payload: dict, *, timeout_s: float = TIMEOUT_S) -> int:
    """POST ``payload`` as JSON; returns the HTTP status. Raises on connection errors."""
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async with session.post(url, json=payload) as response:
            return response.status


def _client_error() -> type[Exception]:
    import aiohttp

    return aiohttp.ClientError
