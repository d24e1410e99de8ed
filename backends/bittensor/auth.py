"""btauth/1 on both ends of the miner protocol: the broker signs every request with its hotkey for the
miner's hotkey as receiver; the miner checks header shape, receiver, freshness, signature and replay
(bittensor.http_auth, in that order) and then whether it serves the caller at all.

The broker signs with `bittensor_core` (the SDK's Rust core, which `bittensor.sp_core` re-exports) and
builds the btauth/1 payload itself, byte for byte `http_auth.build_payload` (pinned by
tests/backends/bittensor/test_btauth_pin.py, which also checks every signed request against the real `http_auth.verify`):
`import bittensor` takes 0.25–0.5 s, a third of the broker's budget from submit to a job's start, and
the core alone 7 ms. The miner verifies with `http_auth.verify` itself.

The miner's nonce store is SQLite, not the SDK's in-memory default, so a request captured before a
restart cannot be replayed after it. A bundle upload is signed over an empty body: its bytes are bound
by the sha256 in its signed path, and checked against it as they stream in (a body of gigabytes is
never held in memory to be hashed before the signature is checked).
"""

from __future__ import annotations

import hashlib
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


PROTOCOL = "btauth/1"
SCHEME = "sr25519"


def payload(*, method: str, path: str, body: bytes, nonce_ns: int, sender: str, receiver: str) -> bytes:
    """The signed bytes of a btauth/1 request (`http_auth.build_payload` for an sr25519 key and a receiver)."""
    return "\n".join((PROTOCOL, SCHEME, method.upper(), path, hashlib.sha256(body).hexdigest(), str(nonce_ns),
                      sender, receiver)).encode()


def sign(signer, *, method: str, path: str, body: bytes, receiver: str, nonce_ns: int | None = None) -> dict[str, str]:
    """The btauth headers of one request (sign every retry again: each gets a fresh nonce). `path` is the
    request target exactly as sent, query included; `signer` an sr25519 keypair, or a wallet (its hotkey)."""
    key = signer.hotkey if hasattr(signer, "hotkey") else signer
    if getattr(key, "crypto_type", 1) != 1:
        raise ValueError("btauth requests are signed with an sr25519 hotkey")
    nonce = time.time_ns() if nonce_ns is None else int(nonce_ns)
    signed = payload(method=method, path=path, body=body, nonce_ns=nonce, sender=key.ss58_address, receiver=receiver)
    return {"X-Bittensor-Version": "1", "X-Bittensor-Hotkey": key.ss58_address, "X-Bittensor-Nonce": str(nonce),
            "X-Bittensor-Signature": "0x" + bytes(key.sign(signed)).hex(), "X-Bittensor-Receiver": receiver}


def load_hotkey(path: Path):
    """The plaintext hotkey keyfile at `path` as an sr25519 keypair (`bittensor_core`, no SDK import);
    ValueError for an encrypted or unreadable one."""
    import bittensor_core

    data = path.read_bytes()
    if bittensor_core.keyfile_data_is_encrypted(data):
        raise ValueError("it is encrypted; requests are signed unattended, with a plaintext hotkey")
    try:
        return bittensor_core.deserialize_keypair_from_keyfile_data(data)
    except Exception as exc:  # the core raises its own KeyfileError kinds
        raise ValueError(f"not a keyfile ({type(exc).__name__})") from None


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
