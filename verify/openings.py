"""What an executor opens for a challenged segment i, and the checks against the signed root.

For segment i the executor opens (notes/verification.md §3): the full state S_i, the decision trace
of segment i, the weights of S_{i+1} plus ``sha256(rest_{i+1})``, and Merkle proofs for leaves i and
i+1. The learner audit of RL jobs (§8b) also asks for the rest of S_{i+1} in full, with the trace of
segment i+1 that its committed hash covers, to check the environment and the replay buffer bit for bit.

Nothing opened is used before :func:`open_checked` / :func:`open_next_state_checked` have tied it
to the commitment. The hashes are recomputed here from the tensors (the executor's manifests and
declared hashes are never trusted)::

    weights_sha256 = sha256(canonical(weights_i))
    rest_sha256    = sha256(canonical(rest_i) ‖ canonical(trace_i))      (jobs/checkpoint.py)
    h_i            = sha256(weights_sha256 ‖ rest_sha256)                 (raw digests)

and ``h_i`` must sit at index i under ``root`` (RFC 6962 inclusion proof); for i + 1 = n the opened
weights must also hash to ``final_sha256``. Any mismatch raises :class:`OpeningError` with the reason.

:class:`Openings` is the transport-neutral protocol; :class:`LocalOpenings` reads the runtime's
checkpoint directory (local and trusted executors, tests). A remote transport implements the same two
methods over HTTP.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Protocol

import torch

from trainmaster.jobs.canonical import CanonicalError, canonical_tensors, chunks, sha256_of, state_sha256
from trainmaster.jobs.checkpoint import (
    DECISIONS,
    REST,
    WEIGHTS,
    CheckpointError,
    leaf_of,
    read_canonical_file,
    read_manifest,
    segment_dir,
    segment_indices,
)
from trainmaster.jobs.commitment import Commitment, segment_leaves
from trainmaster.jobs.decisions import DecisionTrace, DecisionTraceError
from trainmaster.jobs.merkle import inclusion_proof
from trainmaster.jobs.state import TrainState

from .errors import VerificationError
from .signing import HEX64, check_leaf

Tensors = Mapping[str, torch.Tensor]


class OpeningError(VerificationError):
    """An opening that cannot be obtained or does not match the commitment (the executor is blamed)."""


@dataclass(frozen=True)
class SegmentOpening:
    """What the executor sends for challenged segment ``index`` (unchecked)."""

    index: int
    weights: Tensors
    rest: Tensors
    trace: Tensors
    proof: list[str]
    next_weights: Tensors
    next_rest_sha256: str
    next_proof: list[str]


@dataclass(frozen=True)
class NextStateOpening:
    """The rest of S_{index+1} in full, with the trace of segment index+1 (empty for the final state)."""

    index: int
    rest: Tensors
    trace: Tensors


class Openings(Protocol):
    """Where the auditor gets what the executor opens; implementations raise :class:`OpeningError`."""

    def open(self, index: int) -> SegmentOpening:
        """S_i, the trace of segment i, the weights of S_{i+1}, sha256(rest_{i+1}), proofs of leaves i, i+1."""

    def open_next_state(self, index: int) -> NextStateOpening:
        """The rest of S_{i+1} and the trace of segment i+1 (for the learner audit)."""


@dataclass(frozen=True)
class OpeningHashes:
    """The hashes recomputed from an opening (lowercase hex), all tied to the root."""

    leaf: str
    next_leaf: str
    weights_sha256: str
    rest_sha256: str
    next_weights_sha256: str
    next_rest_sha256: str


@dataclass(frozen=True)
class CheckedOpening:
    """An opening whose every item matched the commitment."""

    index: int
    state: TrainState
    trace: DecisionTrace
    next_weights: dict[str, torch.Tensor]
    hashes: OpeningHashes


def open_checked(openings: Openings, commitment: Commitment, index: int) -> CheckedOpening:
    """Open segment ``index`` and check S_i, its trace and the weights of S_{i+1} against the root."""
    if not 0 <= index < commitment.n:
        raise ValueError(f"segment {index} is outside 0..{commitment.n - 1}")
    opening = openings.open(index)
    if opening.index != index:
        raise OpeningError(f"asked to open segment {index}, got segment {opening.index}")
    weights_sha, rest_sha = _sha(opening.weights, f"S_{index} weights"), _rest_sha(opening.rest, opening.trace, index)
    leaf = leaf_of(weights_sha, rest_sha)
    _check_leaf(commitment, index, leaf, opening.proof, f"S_{index} (weights, rest and trace of segment {index})")
    next_weights_sha = _sha(opening.next_weights, f"S_{index + 1} weights")
    next_rest_sha = _hex64(opening.next_rest_sha256, f"sha256(rest_{index + 1})")
    next_leaf = leaf_of(next_weights_sha, next_rest_sha)
    _check_leaf(commitment, index + 1, next_leaf, opening.next_proof, f"the weights of S_{index + 1}")
    if index + 1 == commitment.n and next_weights_sha != commitment.final_sha256:
        raise OpeningError(f"the weights of S_{commitment.n} do not hash to the committed final_sha256")
    _check_finite(opening.weights, f"S_{index}")
    _check_finite(opening.next_weights, f"S_{index + 1}")
    return CheckedOpening(
        index=index,
        state=TrainState(weights=dict(opening.weights), rest=dict(opening.rest)),
        trace=_trace(opening.trace, index),
        next_weights=dict(opening.next_weights),
        hashes=OpeningHashes(leaf, next_leaf, weights_sha, rest_sha, next_weights_sha, next_rest_sha),
    )


def open_next_state_checked(openings: Openings, opening: CheckedOpening) -> dict[str, torch.Tensor]:
    """The rest of S_{i+1}, checked against the ``sha256(rest_{i+1})`` already tied to the root."""
    index = opening.index
    opened = openings.open_next_state(index)
    if opened.index != index:
        raise OpeningError(f"asked for the state after segment {index}, got the one after {opened.index}")
    if _rest_sha(opened.rest, opened.trace, index + 1) != opening.hashes.next_rest_sha256:
        raise OpeningError(f"the opened rest of S_{index + 1} does not match its committed leaf")
    return dict(opened.rest)


def _sha(tensors: Tensors, what: str) -> str:
    try:
        return state_sha256(tensors)
    except CanonicalError as exc:
        raise OpeningError(f"{what} cannot be serialized canonically: {exc}") from exc


def _rest_sha(rest: Tensors, trace: Tensors, index: int) -> str:
    try:
        hasher = sha256_of(chunks(canonical_tensors(rest)))
        return sha256_of(chunks(canonical_tensors(trace)), hasher).hexdigest()
    except CanonicalError as exc:
        raise OpeningError(f"the rest or trace of S_{index} cannot be serialized canonically: {exc}") from exc


def _hex64(value: str, what: str) -> str:
    if not (isinstance(value, str) and HEX64.fullmatch(value)):
        raise OpeningError(f"{what} is not 64 lowercase hex digits")
    return value


def _check_leaf(commitment: Commitment, index: int, leaf: str, proof: list[str], what: str) -> None:
    try:
        check_leaf(commitment, index, leaf, proof)
    except VerificationError as exc:
        raise OpeningError(f"{what} does not match leaf {index} of the committed root: {exc.reason}") from exc


def _check_finite(weights: Tensors, what: str) -> None:
    bad = [name for name, t in weights.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise OpeningError(f"the weights of {what} hold NaN or Inf (in {', '.join(sorted(bad)[:3])})")


def _trace(tensors: Tensors, index: int) -> DecisionTrace:
    try:
        return DecisionTrace.from_tensors(tensors)
    except DecisionTraceError as exc:
        raise OpeningError(f"the decision trace of segment {index} is malformed: {exc}") from exc


class LocalOpenings:
    """Openings read from a runtime checkpoint directory (``segments/<i>/...``, docs/runtime.md).

    Files are parsed strictly (canonical safetensors only, nothing unpickled); whether they are
    the committed ones is decided by :func:`open_checked`, never by the manifests found here.
    """

    def __init__(self, checkpoint_dir: Path):
        self.checkpoint_dir = Path(checkpoint_dir)

    def open(self, index: int) -> SegmentOpening:
        here, after = segment_dir(self.checkpoint_dir, index), segment_dir(self.checkpoint_dir, index + 1)
        try:
            next_rest_sha = read_manifest(after).rest_sha256
            if next_rest_sha is None:
                raise OpeningError(f"segment {index + 1} has no committed rest hash yet")
            return SegmentOpening(
                index=index,
                weights=read_canonical_file(here / WEIGHTS),
                rest=read_canonical_file(here / REST),
                trace=read_canonical_file(here / DECISIONS),
                proof=self._proof(index),
                next_weights=read_canonical_file(after / WEIGHTS),
                next_rest_sha256=next_rest_sha,
                next_proof=self._proof(index + 1),
            )
        except CheckpointError as exc:
            raise OpeningError(f"cannot open segment {index}: {exc}") from exc

    def open_next_state(self, index: int) -> NextStateOpening:
        after = segment_dir(self.checkpoint_dir, index + 1)
        try:
            return NextStateOpening(
                index=index, rest=read_canonical_file(after / REST), trace=read_canonical_file(after / DECISIONS)
            )
        except CheckpointError as exc:
            raise OpeningError(f"cannot open the state after segment {index}: {exc}") from exc

    @cached_property
    def _leaves(self) -> list[bytes]:
        indices = segment_indices(self.checkpoint_dir)
        if not indices:
            raise OpeningError(f"{self.checkpoint_dir} holds no segments")
        return segment_leaves(self.checkpoint_dir, indices[-1])

    def _proof(self, index: int) -> list[str]:
        if not 0 <= index < len(self._leaves):
            raise OpeningError(f"leaf {index} is not in the {len(self._leaves)} leaves on disk")
        return [h.hex() for h in inclusion_proof(self._leaves, index)]
