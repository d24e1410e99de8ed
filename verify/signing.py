"""Checking commitment signatures (sr25519 hotkeys), Merkle proofs of challenged leaves, and the final
weights hash. Making signatures is `jobs/signing.py` (the executor's side never imports the verifier).

The executor signs ``Commitment.canonical_json()`` — the exact bytes of ``commitment.json``
(docs/protocol.md §2) — with its hotkey. The signature travels as ``0x`` + 128 lowercase hex
characters (64 bytes). The broker verifies it against the hotkey it dispatched to, then checks that
the signed fields are the ones this attempt must have.

sr25519 has no public-key recovery: a signature that does not verify against the dispatched hotkey
was either made by another key or over other bytes, and no verifier can tell which.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from trainmaster.jobs.commitment import Commitment
from trainmaster.jobs.files import sha256_file
from trainmaster.jobs.merkle import verify_inclusion

from .errors import VerificationError

SIGNATURE = re.compile(r"0x[0-9a-f]{128}")
HEX64 = re.compile(r"[0-9a-f]{64}")


def verify_commitment(
    commitment: Commitment,
    signature_hex: str | None,
    hotkey_ss58: str,
    *,
    expected_job_id: str,
    expected_bundle_sha256: str,
    expected_k: int,
    expected_n: int,
) -> None:
    """Raise :class:`VerificationError` unless the dispatched hotkey signed exactly this attempt's commitment.

    The signature is checked first (nothing in an unsigned commitment can be trusted), then the
    signed fields against the spec: the job (a root from another job is a replayed result), the
    bundle, k, and n = T/k.
    """
    check_signature(commitment, signature_hex, hotkey_ss58)
    check_fields(
        commitment, expected_job_id=expected_job_id, expected_bundle_sha256=expected_bundle_sha256,
        expected_k=expected_k, expected_n=expected_n,
    )


def check_fields(
    commitment: Commitment, *, expected_job_id: str, expected_bundle_sha256: str, expected_k: int, expected_n: int
) -> None:
    """Raise unless the commitment is for this job and bundle, with the spec's k and n = T/k."""
    problems = []
    if commitment.job_id != expected_job_id:
        problems.append(
            f"the commitment is for job {commitment.job_id!r}, not {expected_job_id!r} (a root from another job)"
        )
    if commitment.bundle_sha256 != expected_bundle_sha256:
        problems.append(
            f"the commitment names bundle {commitment.bundle_sha256[:12]}…, not the dispatched "
            f"{expected_bundle_sha256[:12]}…"
        )
    if commitment.k != expected_k:
        problems.append(f"the commitment has segment length k = {commitment.k}, the spec says {expected_k}")
    if commitment.n != expected_n:
        problems.append(f"the commitment has n = {commitment.n} segments, the spec's T/k is {expected_n}")
    if problems:
        raise VerificationError("; ".join(problems))


def check_signature(commitment: Commitment, signature_hex: str | None, hotkey_ss58: str) -> None:
    """Raise unless ``signature_hex`` is the sr25519 signature of ``hotkey_ss58`` over the canonical commitment."""
    from bittensor_core import CRYPTO_SR25519, verify

    if not signature_hex:
        raise VerificationError("the commitment is not signed")
    if not SIGNATURE.fullmatch(signature_hex):
        raise VerificationError(
            f"the commitment signature is malformed: expected 0x and 128 lowercase hex digits, "
            f"got {len(signature_hex)} characters"
        )
    try:
        valid = verify(commitment.canonical_json(), bytes.fromhex(signature_hex[2:]), hotkey_ss58, CRYPTO_SR25519)
    except ValueError as exc:  # an undecodable ss58 address
        raise VerificationError(f"cannot check the signature against hotkey {hotkey_ss58!r}: {exc}") from exc
    if not valid:
        raise VerificationError(
            f"the commitment signature is not valid for the dispatched hotkey {hotkey_ss58}: "
            "it was made by another key, or a signed field was changed"
        )


def check_leaf(commitment: Commitment, index: int, leaf_hex: str, proof: Sequence[str]) -> None:
    """Raise unless ``proof`` shows leaf ``h_index`` = ``leaf_hex`` under the commitment's root.

    The tree has ``n + 1`` leaves ``h_0..h_n``; proofs are lists of lowercase hex sibling hashes
    (``trainmaster.jobs.commitment.segment_proof``).
    """
    if not 0 <= index <= commitment.n:
        raise VerificationError(f"leaf {index} is outside the committed tree of {commitment.n + 1} leaves")
    if not HEX64.fullmatch(leaf_hex):
        raise VerificationError(f"leaf {index} is not 64 lowercase hex digits")
    if not all(isinstance(h, str) and HEX64.fullmatch(h) for h in proof):
        raise VerificationError(f"the proof for leaf {index} holds an entry that is not 64 lowercase hex digits")
    siblings = [bytes.fromhex(h) for h in proof]
    if not verify_inclusion(bytes.fromhex(leaf_hex), index, commitment.n + 1, siblings, bytes.fromhex(commitment.root)):
        raise VerificationError(f"the Merkle proof for leaf {index} does not lead to the committed root")


def check_final(commitment: Commitment, final_weights_path: Path, *, sha256: str | None = None) -> None:
    """Raise unless the returned final weights are the committed ``weights_n``.

    The runtime writes weights in the canonical serialization (``trainmaster.jobs.canonical``), and
    the committed hash is the sha256 of those exact bytes, so the file's sha256 must equal
    ``final_sha256`` and its header must be the canonical one for the tensors it holds.
    ``sha256``: the file's hash as the caller has just checked it (the integrity check's recorded
    outputs), so large final weights are not read a second time.
    """
    from .safeload import SafeLoadError, canonical_header_matches

    actual = sha256 or sha256_file(final_weights_path)
    if actual != commitment.final_sha256:
        raise VerificationError(
            f"{Path(final_weights_path).name} has sha256 {actual[:12]}…, "
            f"the commitment's final_sha256 is {commitment.final_sha256[:12]}…"
        )
    try:
        canonical = canonical_header_matches(final_weights_path)
    except SafeLoadError as exc:
        raise VerificationError(f"{Path(final_weights_path).name} is not safe to load: {exc}") from exc
    if not canonical:
        raise VerificationError(
            f"{Path(final_weights_path).name} is not in the canonical serialization, so its hash is not the committed weights hash"
        )
