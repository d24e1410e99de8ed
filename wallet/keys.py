"""The broker's own sr25519 key: made once under the home (mode 0600), it signs what the broker promises.

The executor of an untrusted attempt gets a receipt of its settlement (verdict, amount, the revealed
challenge secret) signed with this key, and countersigns it with its hotkey (broker/money/settlement.py).
The key is a 32-byte seed in a file only its owner can read, written whole before it appears (a
temporary file linked into place), so two processes that start at once end with the same key.
bittensor's Keypair makes and checks the signatures; it is imported only when a key is used.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from pathlib import Path

SEED_BYTES = 32
SIGNATURE = re.compile(r"0x[0-9a-f]{128}")


class BrokerKeyError(RuntimeError):
    """The broker's key file cannot be used (readable by others, or not a seed)."""


class BrokerKey:
    """The broker's keypair: `ss58` is its public address, `sign` signs bytes."""

    def __init__(self, seed: bytes):
        from bittensor_core import Keypair

        self._keypair = Keypair.create_from_seed(seed)
        self.ss58: str = self._keypair.ss58_address

    def sign(self, data: bytes) -> str:
        """The sr25519 signature over `data`, as ``0x`` + 128 lowercase hex digits."""
        return "0x" + bytes(self._keypair.sign(data)).hex()


def broker_key(path: Path) -> BrokerKey:
    """The key kept in `path`, made there (mode 0600) on first use."""
    path = Path(path)
    if not path.exists():
        _create(path)
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise BrokerKeyError(f"{path} is readable by others (mode {stat.S_IMODE(mode):o}); make it 0600")
    text = path.read_text(encoding="ascii").strip()
    if not re.fullmatch(r"[0-9a-f]{64}", text):
        raise BrokerKeyError(f"{path} does not hold a {SEED_BYTES}-byte hex seed")
    return BrokerKey(bytes.fromhex(text))


def _create(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, secrets.token_bytes(SEED_BYTES).hex().encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(temporary, path)  # fails if another process made the key first: theirs is kept
    except FileExistsError:
        pass
    finally:
        temporary.unlink()


def signed_by(data: bytes, signature: str, ss58: str) -> bool:
    """Whether `signature` (``0x`` + hex) is `ss58`'s sr25519 signature over `data`."""
    from bittensor_core import CRYPTO_SR25519, verify

    if not isinstance(signature, str) or not SIGNATURE.fullmatch(signature):
        return False
    try:
        return bool(verify(data, bytes.fromhex(signature[2:]), ss58, CRYPTO_SR25519))
    except ValueError:  # an undecodable ss58 address
        return False
