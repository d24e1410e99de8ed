"""Signing with an sr25519 hotkey: what an executor (a miner) signs, importable without the verifier.

The executor signs ``Commitment.canonical_json()`` — the exact bytes of ``commitment.json``
(docs/protocol.md §2) — with its hotkey; the signature travels as ``0x`` + 128 lowercase hex
characters (64 bytes). Checking signatures is the verifier's (`verify/signing.py`); making them lives
here, below both, so a backend that runs the executor's side never imports `verify`.
"""

from __future__ import annotations

from trainmaster.jobs.commitment import Commitment


def sign(message: bytes, keypair) -> str:
    """``keypair``'s signature over ``message`` as ``0x`` + lowercase hex.

    ``keypair`` is a ``bittensor.sp_core.Keypair`` (a wallet's ``hotkey``) or anything with a
    ``sign(bytes) -> bytes`` method that makes sr25519 signatures.
    """
    return "0x" + bytes(keypair.sign(message)).hex()


def sign_commitment(commitment: Commitment, keypair) -> str:
    """The executor's signature over the canonical commitment bytes."""
    return sign(commitment.canonical_json(), keypair)
