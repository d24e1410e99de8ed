"""Capabilities as mixins: a backend inherits the ones it supports, and its feature list is derived.

A backend that lacks a feature must say why in `Backend.unsupported`, so the planner can print a
reason ("local: no spot instances: your own GPUs are never preempted") instead of a bare "no".
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field

from trainmaster.backends.base import Backend, Frozen, Handle


class SupportsMultiGpu:
    """More than one GPU on a node."""


class SupportsMultiNode:
    """More than one node per run."""


class SupportsSpot:
    """Preemptible capacity at a discount; the run resumes from its last checkpoint."""


class SupportsRemoteData:
    """Reads s3://, gs:// or az:// inputs itself."""


class ExecutorIdentity(Frozen):
    """Who ran an untrusted attempt: the key its commitment must be signed with, and its owner."""

    hotkey: str
    coldkey: str | None = None


class SignedCommitment(Frozen):
    """The executor's `commitment.json` exactly as it sent it, and its sr25519 signature (hex)."""

    commitment: str
    signature: str


class Conclusion(Frozen):
    """What the broker tells an untrusted executor after its verdict (docs/protocol.md §8): the verdict,
    the amount paid (rao), the attempt's challenge secret revealed (its sha256 is the digest published at
    dispatch, so the executor can check its challenge was drawn honestly), and a receipt of all that: the
    canonical JSON `receipt` and the broker's sr25519 `signature` over its bytes, by the key `broker`."""

    verdict: str
    amount_rao: int
    challenge_secret: str
    receipt: str
    signature: str
    broker: str


class Acknowledgement(Frozen):
    """The executor's answer to its conclusion: its hotkey's sr25519 signature over the receipt's bytes."""

    countersignature: str


class KeepsSegments:
    """Keeps the committed segments of a runtime job where the replay audit can have them opened
    (docs/runtime.md: a checkpoint directory of `segments/<i>/`)."""

    async def open_segments(self, handle: Handle, indices: list[int], dest: Path) -> Path:
        """Segments `indices` (each with the state after it) and every segment's manifest, laid out as
        the runtime's checkpoint directory; returns that directory (`dest`, or where they already are)."""
        raise NotImplementedError


class HeldSegment(Frozen):
    """One segment an attempt's backend still holds on its disk: its index, or None for a half-written one
    (a kill left it; never resumed from, never opened), and how many bytes it takes."""

    index: int | None = Field(None, ge=0)
    bytes: int = Field(ge=0)


class ReleasesSegments:
    """Gives back the disk an attempt's segments take, keeping those the broker names (retention,
    broker/filekeeping/reclaim.py). The broker decides which indices to keep; the backend alone knows where they
    are, so the broker never opens the attempt's scratch folder itself."""

    async def segments_held(self, handle: Handle) -> list[HeldSegment]:
        """The segments the attempt holds now, complete ones by index, and the half-written ones (index None)."""
        raise NotImplementedError

    async def release_segments(self, handle: Handle, keep: set[int]) -> int:
        """Remove every segment of the attempt but those in `keep` (half-written ones go too); returns the
        bytes freed. Idempotent: what is gone is not counted again, and a kept index is never removed."""
        raise NotImplementedError


class CheckpointRef(Frozen):
    """Where an attempt's newest committed state is, in words only its backend understands: a local path,
    an `s3://` URI, a miner's attempt and segment. The broker never opens it: it passes it back as the
    `AttemptContext.resume_from` of a later attempt on the same backend (a reference is not fetched
    across backends yet, so an attempt on another backend starts afresh)."""

    uri: str = Field(min_length=1)
    segment: int | None = Field(None, ge=0, description="The newest complete segment there, when the backend can tell.")
    step: int | None = Field(None, ge=0, description="The training step that segment ends at.")


class MetricsChunk(Frozen):
    """A piece of an attempt's `metrics.jsonl`: `data` from byte `offset` on, like `LogChunk`; `size` is
    the whole file's size now (0 before it exists), so a reader can ask for its tail only, and
    `modified_at` when the backend last saw it change (Unix time, None before it exists)."""

    data: bytes
    offset: int = Field(ge=0)
    size: int = Field(ge=0)
    modified_at: float | None = None

    @property
    def next_offset(self) -> int:
        return self.offset + len(self.data)

    @classmethod
    def from_file(cls, path: Path, offset: int, limit: int) -> MetricsChunk:
        """At most `limit` bytes of the file `path` from `offset` on, with its size and modification time, for a
        backend that holds the file on a filesystem (an empty chunk of size 0 while there is no file, or while it
        is not a regular file: a FIFO the job made is never opened, a link never followed)."""
        from trainmaster.jobs.files import HostileFile, open_regular

        try:
            fd, info = open_regular(path)
        except (FileNotFoundError, HostileFile):
            return cls(data=b"", offset=offset, size=0)
        with os.fdopen(fd, "rb") as f:
            f.seek(offset)
            data = f.read(max(0, limit))
        return cls(data=data, offset=offset, size=info.st_size, modified_at=info.st_mtime)


class ResumesFromCheckpoints:
    """Reports where an attempt's newest committed state is, so a later attempt on the same backend resumes
    from it (a crash, a preemption, `trainmaster resume`)."""

    async def last_checkpoint(self, handle: Handle) -> CheckpointRef | None:
        """The attempt's newest committed state, None when it committed none."""
        raise NotImplementedError


class NotesInRunLog:
    """Keeps the run's log itself (the local backend's supervisor writes it), so the broker can say there why it
    stopped the run: a user reading `trainmaster logs` sees the cost cap whichever of the two stopped it first."""

    async def note(self, handle: Handle, line: str) -> None:
        """`[trainmaster] line` appended to the attempt's log; nothing when the log is not a regular file."""
        raise NotImplementedError


class ReportsMetrics:
    """Serves the job's `metrics.jsonl` as it grows, for the live status line."""

    async def metrics(self, handle: Handle, offset: int = 0, limit: int = 2**16) -> MetricsChunk:
        """At most `limit` bytes of the attempt's `metrics.jsonl` from `offset` on."""
        raise NotImplementedError


class AllocatesMachine:
    """Runs attempts on one fixed machine whose CPUs, memory and GPUs it hands out (the local backend).

    The broker keeps the claims in its store; `fit` is pure over the claims held now, so the broker can
    call it inside the transaction that records the new claim (race-free across processes). A job
    that does not fit now waits in the broker's queue."""

    def fit(self, spec, held: list[dict]) -> tuple[dict | None, str]:
        """The claim (a dict the broker stores as it is) `spec` gets beside `held`, or None and why it must wait."""
        raise NotImplementedError

    def claimed(self, offer, claim: dict):
        """The offer as dispatched with `claim`: its detail names what the attempt holds (its GPU indices)."""
        raise NotImplementedError


OVERRUN_GRACE_S = 60.0
"""The default of RunsUntrusted.overrun_grace_s."""


class RunsUntrusted(KeepsSegments):
    """Runs on compute we do not control. Its work is paid only after the replay audit accepts it, so
    the backend gives the broker what the audit needs: who ran it, the signed commitment, and, only
    after the commitment is stored, the segments the challenge names (docs/verification.md); after the
    verdict it is told its conclusion and countersigns the receipt (broker/money/settlement.py)."""

    @property
    def overrun_grace_s(self) -> float:
        """Seconds a run may take past its limit (the spec's max_hours or the hours it quoted, plus a tenth) to
        start and upload before the broker ends it on its own clock (broker/deadlines.py)."""
        return OVERRUN_GRACE_S

    async def executor(self, handle: Handle) -> ExecutorIdentity:
        raise NotImplementedError

    async def signed_commitment(self, handle: Handle) -> SignedCommitment:
        raise NotImplementedError

    async def conclude(self, handle: Handle, conclusion: Conclusion) -> Acknowledgement:
        """Tell the executor its settlement, and have it countersign the receipt. Idempotent: the broker
        sends the same conclusion again until it has an acknowledgement stored, so an executor told twice
        answers the same way."""
        raise NotImplementedError


class LeafOpening(Frozen):
    """One committed leaf as an executor opens it for the refereed tier's bisection (docs/protocol.md §3c): the
    chunk digests of S_i's three files — its weights, its rest and the trace of segment i — from which
    ``h_i = sha256(weights ‖ sha256(rest ‖ trace))``, and the leaf's RFC 6962 inclusion proof (siblings from the
    leaf up, lowercase hex). Nothing here is believed before the proof ties ``h_i`` to the signed root."""

    index: int = Field(ge=0)
    weights: str = Field(pattern=r"^[0-9a-f]{64}$")
    rest: str = Field(pattern=r"^[0-9a-f]{64}$")
    trace: str = Field(pattern=r"^[0-9a-f]{64}$")
    proof: list[str] = Field(max_length=64)


class OpensLeaves(RunsUntrusted):
    """An untrusted backend whose executors can be refereed: two of them run the same job and, when their roots
    differ, each opens leaves of its tree one by one (a bisection to the first leaf where they differ), then one
    of them the agreed state before it (docs/protocol.md §3c)."""

    async def open_leaves(self, handle: Handle, indices: list[int]) -> list[LeafOpening]:
        """The leaves `indices` of the executor's committed tree, each with its proof (unchecked here)."""
        raise NotImplementedError

    async def open_state(self, handle: Handle, index: int, dest: Path) -> Path:
        """Segment `index` opened as `open_segments` opens it (S_i in full, its trace, the state after it, every
        manifest), without the sampled tier's boundary chunks; returns the checkpoint directory (`dest`)."""
        raise NotImplementedError


FEATURES: dict[str, type] = {
    "multi_gpu": SupportsMultiGpu,
    "multi_node": SupportsMultiNode,
    "spot": SupportsSpot,
    "remote_data": SupportsRemoteData,
}


def supported(backend: type[Backend]) -> set[str]:
    return {name for name, mixin in FEATURES.items() if issubclass(backend, mixin)}


def unsupported(backend: type[Backend]) -> dict[str, str]:
    """Feature -> the backend's reason, for every feature it does not inherit."""
    return {
        name: backend.unsupported.get(name, "not supported by this backend")
        for name, mixin in FEATURES.items()
        if not issubclass(backend, mixin)
    }


def needed(spec) -> set[str]:
    """Features a spec needs."""
    need = set()
    if spec.resources.gpus > 1:
        need.add("multi_gpu")
    if spec.resources.nodes > 1:
        need.add("multi_node")
    if any(item.is_remote for item in spec.data):
        need.add("remote_data")
    return need
