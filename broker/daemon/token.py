"""The daemon's API token: made at the first start, kept in `<home>/daemon/token` (mode 0600).

The CLI reads the file and sends the token (`Authorization: Bearer …`, or the `trainmaster_token` cookie
a browser gets from the dashboard); the server keeps only its sha256 and compares digests with
`hmac.compare_digest`, so neither the comparison's time nor the server's memory gives the token away.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from trainmaster.broker import paths

COOKIE = "trainmaster_token"


def daemon_dir() -> Path:
    """The daemon's files: its token, its state file (pid, address) and its log."""
    return paths.home() / "daemon"


def token_file() -> Path:
    return daemon_dir() / "token"


def ensure_token() -> str:
    """The token, made (256 random bits, in a new 0600 file) when there is none yet."""
    path = token_file()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return read_token()
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32))
    return read_token()


def read_token() -> str:
    return token_file().read_text().strip()


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def matches(given: str | None, stored_digest: str) -> bool:
    """Whether `given` is the token whose sha256 is `stored_digest` (constant time)."""
    return given is not None and hmac.compare_digest(digest(given), stored_digest)
