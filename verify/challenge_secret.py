"""The per-attempt challenge secret: made before dispatch, published as its sha256, revealed after the verdict.

Apart from :mod:`~trainmaster.verify.challenge` (which draws from a secret) so that the records
that store secrets need not import the challenge, which imports the records (docs/protocol.md §3).
Named so as not to shadow the standard library's ``secrets``.
"""

from __future__ import annotations

import hashlib
import secrets

SECRET_BYTES = 32


def new_secret() -> bytes:
    """A fresh 32-byte challenge secret. Use one per attempt: a revealed one would give away the next challenge."""
    return secrets.token_bytes(SECRET_BYTES)


def secret_digest(secret: bytes) -> str:
    """``sha256(secret)`` in lowercase hex: published before the run, so the revealed secret can be checked."""
    return hashlib.sha256(secret).hexdigest()
