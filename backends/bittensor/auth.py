"""btauth/1 on both ends of the miner protocol: the broker signs every request with its hotkey for the
miner's hotkey as receiver; the miner checks header shape, receiver, freshness, signature and replay
(bittensor.http_auth, in that order) and then whether it serves the caller at all.

The miner's nonce store is SQLite, not the SDK's in-memory default, so a request captured before a
restart cannot be replayed after it. A bundle upload is signed over an empty body: its bytes are bound
by the sha256 in its signed path, and checked against it as they stream in (a body of gigabytes is
never held in memory to be hashed before the signature is checked).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

MAX_AGE_S = 10.0
ALLOWED_SKEW_S = 2.0
RETENTION_S = 60.0
"""How long a seen nonce is kept; at least MAX_AGE_S + ALLOWED_SKEW_S, as http_auth requires."""


class AuthRefused(Exception):
    """A request the miner does not accept: `status` 401 (who sent it is not proven) or 403 (proven, not served);
    `reason` is the check's name only (never the signed payload)."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def sign(signer, *, method: str, path: str, body: bytes, receiver: str) -> dict[str, str]:
    """The btauth headers of one request (sign every retry again: each gets a fresh nonce). `path` is the
    request target exactly as sent, query included."""
    from bittensor import http_auth

    return http_auth.sign(signer, method=method, path=path, body=body, receiver_ss58=receiver)


def check(headers, body: bytes, *, method: str, path: str, miner_hotkey: str, nonces) -> str:
    """The caller's hotkey when the request is signed for `miner_hotkey`, fresh, and new; AuthRefused(401)
    naming the failed check otherwise."""
    from bittensor import http_auth

    try:
        caller = http_auth.verify(headers, body, method=method, path=path, self_hotkey_ss58=miner_hotkey,
                                  max_age=MAX_AGE_S, allowed_skew=ALLOWED_SKEW_S, require_receiver=True,
                                  nonce_store=nonces)
    except http_auth.AuthError as exc:
        raise AuthRefused(401, type(exc).__name__) from None
    return caller.hotkey_ss58


class SqliteNonces:
    """`http_auth.NonceStore` in a SQLite file: (hotkey, nonce) pairs seen in the last RETENTION_S seconds."""

    retention = RETENTION_S

    def __init__(self, path: Path):
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS nonces (hotkey TEXT NOT NULL, nonce INTEGER NOT NULL, "
                         "seen_at REAL NOT NULL, PRIMARY KEY (hotkey, nonce))")
        self._lock = threading.Lock()

    def check_and_store(self, hotkey_ss58: str, nonce_ns: int) -> bool:
        now = time.time()
        with self._lock:
            self._db.execute("DELETE FROM nonces WHERE seen_at < ?", (now - self.retention,))
            try:
                self._db.execute("INSERT INTO nonces VALUES (?, ?, ?)", (hotkey_ss58, int(nonce_ns), now))
            except sqlite3.IntegrityError:
                return False
            return True

    def close(self) -> None:
        self._db.close()
