"""What an executor opens for a challenged segment i, and the checks against the signed root.

For segment i the executor opens (docs/protocol.md §3): the full state S_i, the decision trace
of segment i, the weights of S_{i+1} plus ``sha256(rest_{i+1})``, and Merkle proofs for leaves i and
i+1. The audit then asks for the rest of S_{i+1} in full, with the trace of segment i+1 that its
committed hash covers, and compares every entry of it with its own re-execution's (docs/audit.md).

An opening carries the committed *files* (``weights.safetensors``, ``rest.safetensors``,
``decisions.safetensors``: canonical safetensors, docs/runtime.md), as bytes. Nothing opened is used
before :func:`open_checked` / :func:`open_next_state_checked` have tied it to the commitment; the
hashes are computed here over those bytes (the executor's manifests and declared hashes are never
trusted), after each file's size was checked against what the job's layout allows
(:class:`OpeningLimits`)::

    weights_sha256 = digest(weights file)                          (chunk digest, jobs/chunks.py)
    rest_sha256    = sha256(digest(rest file) ‖ digest(trace file))  (jobs/checkpoint.py)
    h_i            = sha256(weights_sha256 ‖ rest_sha256)           (raw digests)

``h_i`` must sit at index i under ``root`` (RFC 6962 inclusion proof); for i + 1 = n the opened
weights must also have the plain sha256 ``final_sha256``. Then each file is parsed strictly
(:func:`trainmaster.jobs.canonical.deserialize`: bounded header, nothing unpickled, and only exactly
canonical bytes, so the parsed tensors are the committed state). A file opened as a ``bytearray``
(:class:`LocalOpenings` reads each into one) is handed over and parsed in place, its tensors views of
it, so an opened segment holds the bytes opened and no second copy; ``bytes`` are copied out tensor
by tensor, each file let go once parsed (a peak of the bytes opened plus the largest file). Any
mismatch raises :class:`OpeningError` with the reason.

:class:`Openings` is the transport-neutral protocol; :class:`LocalOpenings` reads the runtime's
checkpoint directory (local and trusted executors, tests). A remote transport implements the same two
methods over HTTP.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Protocol

import torch

from trainmaster.jobs.canonical import CanonicalError, deserialize, views
from trainmaster.jobs.checkpoint import (
    DECISIONS,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    REST,
    WEIGHTS,
    CheckpointError,
    leaf_of,
    read_manifest,
    rest_of,
    segment_dir,
    segment_indices,
)
from trainmaster.jobs.chunks import file_digest
from trainmaster.jobs.commitment import Commitment
from trainmaster.jobs.files import HostileFile, open_regular, read_regular
from trainmaster.jobs.decisions import ENTRY_HEADER_BYTES, DecisionTrace, DecisionTraceError
from trainmaster.jobs.merkle import inclusion_proof
from trainmaster.jobs.recipe import Recipe, RecipeConfig
from trainmaster.jobs.state import TrainState

from .errors import VerificationError
from .signing import HEX64, check_leaf


class OpeningError(VerificationError):
    """An opening that cannot be obtained or does not match the commitment (the executor is blamed).

    ``hashes``: what the opened bytes hash to when they matched the root but could not be used
    (evidence that the executor committed them).
    """

    def __init__(self, reason: str, hashes: OpeningHashes | None = None):
        super().__init__(reason)
        self.hashes = hashes


@dataclass(frozen=True)
class OpeningLimits:
    """How many bytes each opened file may have, from the job's own layout; anything larger is
    refused before it is parsed (an executor cannot make the auditor allocate more than what it sent);
    its hash is still checked against the root, so the refusal is evidence against the executor.

    ``weights_bytes`` is exact: every W_i has the names, dtypes and shapes of W0, hence W0's
    canonical size. ``rest_bytes`` bounds the rest of S_i: S_0's rest, the optimizer's moments (at
    most 3× the weights' data, plus their header entries), what the recipe says its buffers may
    grow by (``StateRules.growth_bytes``), and slack for longer numbers in JSON entries and headers.
    ``trace_bytes`` bounds a segment's trace: k steps of ``StateRules.decision_bytes``.
    """

    weights_bytes: int
    rest_bytes: int
    trace_bytes: int

    @classmethod
    def for_job(cls, recipe: Recipe, config: RecipeConfig, initial: TrainState, k: int) -> OpeningLimits:
        weights_data = sum(t.numel() * t.element_size() for t in initial.weights.values())
        moments = 3 * weights_data + len(initial.weights) * 4 * (ENTRY_HEADER_BYTES + 8)
        slack = SLACK_BYTES + DIGITS_SLACK * len(initial.rest)
        return cls(
            weights_bytes=canonical_size(initial.weights),
            rest_bytes=canonical_size(initial.rest) + moments + recipe.rules.growth_bytes(config) + slack,
            trace_bytes=k * recipe.rules.decision_bytes(config) + SLACK_BYTES,
        )


SLACK_BYTES = 4096
"""Room for a file's fixed header and JSON entries whose numbers print longer (a scheduled lr)."""
DIGITS_SLACK = 64
"""Room per entry for shapes and offsets growing by a few digits as buffers fill."""


def canonical_size(tensors: Mapping[str, torch.Tensor]) -> int:
    """The byte size of ``tensors``' canonical file (header included), without serializing them."""
    return sum(len(view) for view in views(tensors))


@dataclass(frozen=True)
class SegmentOpening:
    """What the executor sends for challenged segment ``index`` (unchecked): files as bytes, proofs as hex.

    A file given as a ``bytearray`` is handed over to the checks, which parse it in place (its
    contents rearranged, the tensors views of it): give each opening fresh buffers.
    """

    index: int
    weights: bytes | bytearray
    rest: bytes | bytearray
    trace: bytes | bytearray
    proof: list[str]
    next_weights: bytes | bytearray
    next_rest_sha256: str
    next_proof: list[str]


@dataclass(frozen=True)
class NextStateOpening:
    """The rest file of S_{index+1}, with the trace file of segment index+1 (empty for the final state)."""

    index: int
    rest: bytes | bytearray
    trace: bytes | bytearray


class Openings(Protocol):
    """Where the auditor gets what the executor opens; implementations raise :class:`OpeningError`."""

    def open(self, index: int) -> SegmentOpening:
        """S_i, the trace of segment i, the weights of S_{i+1}, sha256(rest_{i+1}), proofs of leaves i, i+1."""

    def open_next_state(self, index: int) -> NextStateOpening:
        """The rest of S_{i+1} and the trace of segment i+1 (compared with the re-execution's, entry by entry)."""


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


def open_checked(
    openings: Openings, commitment: Commitment, index: int, limits: OpeningLimits | None = None
) -> CheckedOpening:
    """Open segment ``index`` and check S_i, its trace and the weights of S_{i+1} against the root.

    With ``limits``, files larger than the job's layout allows (weights: other than its exact
    size) are refused unparsed, once their hashes (the evidence) are checked against the root.
    """
    if not 0 <= index < commitment.n:
        raise ValueError(f"segment {index} is outside 0..{commitment.n - 1}")
    opening = openings.open(index)
    if opening.index != index:
        raise OpeningError(f"asked to open segment {index}, got segment {opening.index}")
    weights_sha, rest_sha = _digest(opening.weights), rest_of(_digest(opening.rest), _digest(opening.trace))
    leaf = leaf_of(weights_sha, rest_sha)
    _check_leaf(commitment, index, leaf, opening.proof, f"S_{index} (weights, rest and trace of segment {index})")
    next_weights_sha = _digest(opening.next_weights)
    next_rest_sha = _hex64(opening.next_rest_sha256, f"sha256(rest_{index + 1})")
    next_leaf = leaf_of(next_weights_sha, next_rest_sha)
    _check_leaf(commitment, index + 1, next_leaf, opening.next_proof, f"the weights of S_{index + 1}")
    if index + 1 == commitment.n and _sha(opening.next_weights) != commitment.final_sha256:
        raise OpeningError(f"the weights of S_{commitment.n} do not hash to the committed final_sha256")
    hashes = OpeningHashes(leaf, next_leaf, weights_sha, rest_sha, next_weights_sha, next_rest_sha)
    try:
        if limits is not None:
            _check_weights_size(opening.weights, limits, f"S_{index}")
            _check_weights_size(opening.next_weights, limits, f"S_{index + 1}")
            _check_size(opening.rest, limits.rest_bytes, f"the rest of S_{index}")
            _check_size(opening.trace, limits.trace_bytes, f"the trace of segment {index}")
        # Each file is parsed in place (a bytearray) or dropped as soon as it is parsed (popped, and
        # the opening let go), so bytes and parsed tensors never coexist beyond one file.
        files = {"weights": opening.weights, "next_weights": opening.next_weights, "rest": opening.rest, "trace": opening.trace}
        del opening
        weights = _parse(files.pop("weights"), f"S_{index} weights")
        _check_finite(weights, f"S_{index}")
        next_weights = _parse(files.pop("next_weights"), f"S_{index + 1} weights")
        _check_finite(next_weights, f"S_{index + 1}")
        return CheckedOpening(
            index=index,
            state=TrainState(weights=weights, rest=_parse(files.pop("rest"), f"S_{index} rest")),
            trace=_trace(_parse(files.pop("trace"), f"the trace of segment {index}"), index),
            next_weights=next_weights,
            hashes=hashes,
        )
    except OpeningError as exc:
        raise OpeningError(exc.reason, hashes) from exc


def open_next_state_checked(
    openings: Openings, opening: CheckedOpening, *, max_rest_bytes: int | None = None, max_trace_bytes: int | None = None
) -> dict[str, torch.Tensor]:
    """The rest of S_{i+1}, checked against the ``sha256(rest_{i+1})`` already tied to the root.

    A rest over ``max_rest_bytes`` (the audit passes the size of its own re-executed rest, which
    the executor's must equal) or a trace over ``max_trace_bytes`` is refused before it is parsed.
    """
    index = opening.index
    opened = openings.open_next_state(index)
    if opened.index != index:
        raise OpeningError(f"asked for the state after segment {index}, got the one after {opened.index}")
    if rest_of(_digest(opened.rest), _digest(opened.trace)) != opening.hashes.next_rest_sha256:
        raise OpeningError(f"the opened rest of S_{index + 1} does not match its committed leaf")
    if max_rest_bytes is not None:
        _check_size(opened.rest, max_rest_bytes, f"the rest of S_{index + 1}")
    if max_trace_bytes is not None:
        _check_size(opened.trace, max_trace_bytes, f"the trace of segment {index + 1}")
    return _parse(opened.rest, f"S_{index + 1} rest")


def _check_size(data: bytes | bytearray, limit: int, what: str) -> None:
    if len(data) > limit:
        raise OpeningError(f"{what} is {len(data)} bytes, more than the {limit} this job's layout allows: refused unparsed")


def _check_weights_size(data: bytes | bytearray, limits: OpeningLimits, what: str) -> None:
    _check_size(data, limits.weights_bytes, f"the weights of {what}")
    if len(data) != limits.weights_bytes:
        raise OpeningError(
            f"the weights of {what} are {len(data)} bytes, not the {limits.weights_bytes} bytes of the spec model's tensors"
        )


def _sha(*files: bytes | bytearray) -> str:
    digest = hashlib.sha256()
    for data in files:
        if not isinstance(data, bytes | bytearray):
            raise OpeningError(f"an opened file is a {type(data).__name__}, not bytes")
        digest.update(data)
    return digest.hexdigest()


def _digest(data: bytes | bytearray) -> str:
    """The chunk digest of one opened file (jobs/chunks.py)."""
    if not isinstance(data, bytes | bytearray):
        raise OpeningError(f"an opened file is a {type(data).__name__}, not bytes")
    return file_digest([data])


def _parse(data: bytes | bytearray, what: str) -> dict[str, torch.Tensor]:
    """``data`` parsed strictly; a bytearray in place (the opening handed it over, and it is hashed already)."""
    try:
        return deserialize(data, in_place=isinstance(data, bytearray))
    except CanonicalError as exc:
        raise OpeningError(f"{what} is not a canonical safetensors file: {exc}") from exc
    except (TypeError, ValueError, MemoryError) as exc:  # not bytes at all, or too large for this machine
        raise OpeningError(f"{what} cannot be parsed ({type(exc).__name__}: {exc})") from exc


def _hex64(value: str, what: str) -> str:
    if not (isinstance(value, str) and HEX64.fullmatch(value)):
        raise OpeningError(f"{what} is not 64 lowercase hex digits")
    return value


def _check_leaf(commitment: Commitment, index: int, leaf: str, proof: list[str], what: str) -> None:
    try:
        check_leaf(commitment, index, leaf, proof)
    except VerificationError as exc:
        raise OpeningError(f"{what} does not match leaf {index} of the committed root: {exc.reason}") from exc


def _check_finite(weights: dict[str, torch.Tensor], what: str) -> None:
    bad = [name for name, t in weights.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise OpeningError(f"the weights of {what} hold NaN or Inf (in {', '.join(sorted(bad)[:3])})")


def _trace(tensors: dict[str, torch.Tensor], index: int) -> DecisionTrace:
    try:
        return DecisionTrace.from_tensors(tensors)
    except DecisionTraceError as exc:
        raise OpeningError(f"the decision trace of segment {index} is malformed: {exc}") from exc


class LocalOpenings:
    """Openings read from a runtime checkpoint directory (``segments/<i>/...``, docs/runtime.md).

    Whether the files are the committed ones is decided by :func:`open_checked`, never by the
    manifests found here.
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
                weights=_read(here / WEIGHTS),
                rest=_read(here / REST),
                trace=_read(here / DECISIONS),
                proof=self._proof(index),
                next_weights=_read(after / WEIGHTS),
                next_rest_sha256=next_rest_sha,
                next_proof=self._proof(index + 1),
            )
        except CheckpointError as exc:
            raise OpeningError(f"cannot open segment {index}: {exc}") from exc

    def open_next_state(self, index: int) -> NextStateOpening:
        after = segment_dir(self.checkpoint_dir, index + 1)
        try:
            return NextStateOpening(index=index, rest=_read(after / REST), trace=_read(after / DECISIONS))
        except CheckpointError as exc:
            raise OpeningError(f"cannot open the state after segment {index}: {exc}") from exc

    @cached_property
    def _leaves(self) -> list[bytes]:
        """Every segment's leaf as its manifest states it: proofs need them all, and the root checks them.

        Read as plain JSON (a quarter of the time of validating each manifest): a wrong leaf only
        yields a proof that :func:`open_checked` refuses.
        """
        indices = segment_indices(self.checkpoint_dir)
        if not indices:
            raise OpeningError(f"{self.checkpoint_dir} holds no segments")
        try:
            return [
                bytes.fromhex(json.loads(read_regular(segment_dir(self.checkpoint_dir, i) / MANIFEST, MAX_MANIFEST_BYTES))["leaf"])
                for i in range(indices[-1] + 1)
            ]
        except (OSError, ValueError, KeyError, TypeError, HostileFile) as exc:
            raise OpeningError(f"cannot read the segment leaves in {self.checkpoint_dir}: {exc}") from exc

    def _proof(self, index: int) -> list[str]:
        if not 0 <= index < len(self._leaves):
            raise OpeningError(f"leaf {index} is not in the {len(self._leaves)} leaves on disk")
        return [h.hex() for h in inclusion_proof(self._leaves, index)]


def _read(path: Path) -> bytearray:
    """The file's bytes, read into a bytearray of their own that parsing then takes over (no second copy)."""
    try:
        fd, _ = open_regular(path)  # a link or FIFO is refused, never opened
        with os.fdopen(fd, "rb", buffering=0) as file:
            data = bytearray(os.fstat(file.fileno()).st_size)
            with memoryview(data) as view:
                filled = 0
                while filled < len(data) and (got := file.readinto(view[filled:])):
                    filled += got
    except (OSError, HostileFile) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if filled != len(data):
        raise CheckpointError(f"{path} shrank while it was read")
    return data
