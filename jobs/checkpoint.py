"""Segment checkpoints on disk: atomic safetensors files, hashed while written, with a JSON manifest.

Layout (docs/runtime.md, "Checkpoints on disk")::

    <checkpoint dir>/segments/<i as 8 digits>/
        weights.safetensors     canonical serialization of weights_i      (written at step i*k)
        rest.safetensors        canonical serialization of the rest of S_i (written at step i*k)
        decisions.safetensors   decision trace of steps i*k .. (i+1)*k-1  (written when they are done)
        manifest.json           sizes and sha256 of the files; once the trace is written also
                                weights_sha256, rest_sha256 = sha256(rest ‖ decisions) and the leaf

Every file is written to a temporary name, fsynced, renamed into place, and the directory fsynced;
the manifest goes last, so a segment without a manifest never counts. Nothing is ever pickled.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from .canonical import CanonicalError, canonical_tensors, chunks, deserialize, sha256_of
from .state import TrainState

FORMAT = "trainmaster-checkpoint-v1"
MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
REST = "rest.safetensors"
DECISIONS = "decisions.safetensors"
SEGMENTS = "segments"

_HASHERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="trainmaster-hash")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written, or one on disk that is missing, truncated or tampered with."""


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    sha256: str
    bytes: int


class SegmentManifest(BaseModel):
    """What ``manifest.json`` holds for segment ``segment`` (state S_i at step ``step``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    format: Literal["trainmaster-checkpoint-v1"] = FORMAT
    job_id: str
    recipe: str
    segment: int
    step: int
    k: int
    files: dict[str, FileEntry]
    weights_sha256: str
    rest_sha256: str | None = None
    leaf: str | None = None


@dataclass
class PendingSegment:
    """A segment whose state is on disk but whose decision trace (and so its leaf) is not yet."""

    directory: Path
    manifest: SegmentManifest
    rest_hasher: "hashlib._Hash"


@dataclass
class LoadedSegment:
    """A segment read back from disk, every file checked against its manifest."""

    manifest: SegmentManifest
    state: TrainState
    trace: dict[str, torch.Tensor] | None
    pending: PendingSegment


def segment_dir(root: Path, index: int) -> Path:
    return Path(root) / SEGMENTS / f"{index:08d}"


def segment_indices(root: Path) -> list[int]:
    """Indices of the segments under ``root`` that have a manifest, ascending."""
    base = Path(root) / SEGMENTS
    if not base.is_dir():
        return []
    return sorted(int(p.name) for p in base.iterdir() if p.name.isdigit() and (p / MANIFEST).is_file())


def leaf_of(weights_sha256: str, rest_sha256: str) -> str:
    """``h_i = sha256(sha256(weights_i) ‖ sha256(rest_i))`` over the raw 32-byte digests, as hex."""
    return hashlib.sha256(bytes.fromhex(weights_sha256) + bytes.fromhex(rest_sha256)).hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, views: Sequence[memoryview | bytes]) -> int:
    """Write ``views`` to ``path`` via a fsynced temporary file and a rename; return the size."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as handle:
            for view in views:
                handle.write(view)
            handle.flush()
            os.fsync(handle.fileno())
            size = handle.tell()
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"could not write {path}: {exc}") from exc
    return size


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` durably (temporary file, fsync, rename, fsync of the directory)."""
    _write_atomic(Path(path), [data])
    fsync_dir(Path(path).parent)


def write_canonical_files(directory: Path, files: Mapping[str, Mapping[str, object]]) -> dict[str, tuple[int, "hashlib._Hash"]]:
    """Write each ``name -> state`` as a canonical safetensors file, hashing while writing.

    Hashing runs on worker threads over the same memory the writer reads, so the cost is about
    ``max(write, hash)`` rather than the sum. Returns ``name -> (size, sha256 hasher)``.
    Raises :class:`CanonicalError` before touching the disk if a state is not serializable.
    """
    views = {name: chunks(canonical_tensors(state)) for name, state in files.items()}
    hashing = {name: _HASHERS.submit(sha256_of, parts) for name, parts in views.items()}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        sizes = {name: _write_atomic(directory / name, parts) for name, parts in views.items()}
        fsync_dir(directory)
    except OSError as exc:
        raise CheckpointError(f"could not write {directory}: {exc}") from exc
    finally:
        hashers = {name: future.result() for name, future in hashing.items()}
    return {name: (sizes[name], hashers[name]) for name in files}


def write_manifest(directory: Path, manifest: SegmentManifest) -> None:
    text = json.dumps(manifest.model_dump(), sort_keys=True, indent=2) + "\n"
    write_bytes_atomic(directory / MANIFEST, text.encode("utf-8"))


def write_state(
    root: Path, index: int, state: TrainState, *, job_id: str, recipe: str, step: int, k: int
) -> PendingSegment:
    """Write S_index (weights and rest) and its first manifest."""
    directory = segment_dir(root, index)
    written = write_canonical_files(directory, {WEIGHTS: state.weights, REST: state.rest})
    files = {name: FileEntry(sha256=hasher.hexdigest(), bytes=size) for name, (size, hasher) in written.items()}
    manifest = SegmentManifest(
        job_id=job_id, recipe=recipe, segment=index, step=step, k=k, files=files, weights_sha256=files[WEIGHTS].sha256
    )
    write_manifest(directory, manifest)
    return PendingSegment(directory, manifest, written[REST][1])


def complete_segment(pending: PendingSegment, trace: Mapping[str, torch.Tensor]) -> SegmentManifest:
    """Write the segment's decision trace and the final manifest with ``rest_sha256`` and the leaf."""
    size, hasher = write_canonical_files(pending.directory, {DECISIONS: trace})[DECISIONS]
    rest = pending.rest_hasher.copy()
    sha_rest = sha256_of(chunks(canonical_tensors(trace)), rest).hexdigest()
    files = {**pending.manifest.files, DECISIONS: FileEntry(sha256=hasher.hexdigest(), bytes=size)}
    manifest = pending.manifest.model_copy(
        update={"files": files, "rest_sha256": sha_rest, "leaf": leaf_of(pending.manifest.weights_sha256, sha_rest)}
    )
    write_manifest(pending.directory, manifest)
    return manifest


def read_manifest(directory: Path) -> SegmentManifest:
    try:
        return SegmentManifest.model_validate_json((Path(directory) / MANIFEST).read_bytes())
    except (OSError, ValidationError) as exc:
        raise CheckpointError(f"{directory} has no readable manifest: {exc}") from exc


def _read_checked(directory: Path, name: str, entry: FileEntry) -> bytes:
    path = directory / name
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"checkpoint file {path} is missing: {exc}") from exc
    if len(data) != entry.bytes:
        raise CheckpointError(f"checkpoint file {path} is truncated or extended: {len(data)} bytes, manifest says {entry.bytes}")
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise CheckpointError(f"checkpoint file {path} does not match its manifest sha256 (tampered or corrupt)")
    return data


def read_canonical_file(path: Path) -> dict[str, torch.Tensor]:
    """Read one canonical safetensors file, refusing anything not exactly canonical."""
    try:
        return deserialize(Path(path).read_bytes())
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    except CanonicalError as exc:
        raise CheckpointError(f"{path} is not canonical safetensors: {exc}") from exc


def read_segment(directory: Path) -> LoadedSegment:
    """Read and verify one segment: sizes and hashes against the manifest, canonical form of every file."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    if {WEIGHTS, REST} - manifest.files.keys():
        raise CheckpointError(f"{directory / MANIFEST} does not list {WEIGHTS} and {REST}")
    raw = {name: _read_checked(directory, name, entry) for name, entry in manifest.files.items()}
    try:
        parsed = {name: deserialize(data) for name, data in raw.items()}
    except CanonicalError as exc:
        raise CheckpointError(f"{directory} holds a file that is not canonical safetensors: {exc}") from exc
    state = TrainState(weights=parsed[WEIGHTS], rest=parsed[REST])
    pending = PendingSegment(directory, manifest, hashlib.sha256(raw[REST]))
    return LoadedSegment(manifest, state, parsed.get(DECISIONS), pending)
