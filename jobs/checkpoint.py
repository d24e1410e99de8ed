"""Segment checkpoints on disk: canonical safetensors files, hashed while written, with a JSON manifest.

Layout (docs/runtime.md, "Checkpoints on disk")::

    <checkpoint dir>/segments/<i as 8 digits>/
        weights.safetensors     canonical serialization of weights_i
        rest.safetensors        canonical serialization of the rest of S_i
        decisions.safetensors   decision trace of steps i*k .. (i+1)*k-1 (empty for i = n)
        manifest.json           sizes and chunk digests of the three files (jobs/chunks.py), weights_sha256
                                = digest(weights), rest_sha256 = sha256(digest(rest) ‖ digest(decisions)), leaf

A segment that is not kept (``checkpoint.keep_every``) has its manifest alone: its files were hashed
into the leaf, then dropped; ``jobs/reopen.py`` re-makes them by re-running from the nearest kept one.

A segment is written once, complete, when its trace is done: into ``segments/.<i>.tmp/``, every
file fsynced (in parallel, so the filesystem commits them together), the directory fsynced, then
renamed to ``segments/<i>/`` and ``segments/`` fsynced. A segment directory that exists is whole.
Nothing is ever pickled.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

from . import files
from .canonical import CanonicalError, deserialize, views
from .chunks import file_digest
from .priority import lower_thread_priority
from .segment_layout import (  # noqa: F401  (re-exported: the layout's names, where they always were)
    DECISIONS, FORMAT, MANIFEST, MAX_MANIFEST_BYTES, REST, SEGMENTS, WEIGHTS, CheckpointError, FileEntry,
    SegmentManifest, kept_indices, read_manifest, segment_dir, segment_indices,
)
from .state import TrainState

Buffers = Sequence[bytes | memoryview]
T = TypeVar("T")

_WRITEBACK_BYTES = 16 * 1024 * 1024
_PARALLEL_HASH_BYTES = 8 * 1024 * 1024


_HASHERS = ThreadPoolExecutor(2, thread_name_prefix="trainmaster-hash", initializer=lower_thread_priority)
_SYNCERS = ThreadPoolExecutor(8, thread_name_prefix="trainmaster-fsync", initializer=lower_thread_priority)


@dataclass
class LoadedSegment:
    """A segment read back from disk, every file checked against its manifest."""

    directory: Path
    manifest: SegmentManifest
    state: TrainState
    trace: dict[str, torch.Tensor]


def leaf_of(weights_sha256: str, rest_sha256: str) -> str:
    """``h_i = sha256(digest(weights_i) ‖ rest_sha256)`` over the raw 32-byte digests, as hex."""
    return hashlib.sha256(bytes.fromhex(weights_sha256) + bytes.fromhex(rest_sha256)).hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_all(paths: Sequence[Path]) -> None:
    """fsync several paths at once: concurrent fsyncs share one journal commit (13 ms -> 0.6 ms for 4 files)."""
    for future in [_SYNCERS.submit(_fsync, path) for path in paths]:
        future.result()


def _write_views(path: Path, buffers: Buffers) -> int:
    """Write ``buffers`` to a new file; start the disk writeback as the data goes in."""
    with open(path, "wb") as handle:
        for view in buffers:
            handle.write(view)
            if len(view) >= _WRITEBACK_BYTES:
                _start_writeback(handle, len(view))
        return handle.tell()


def _start_writeback(handle, length: int) -> None:
    """Ask the kernel to start writing the last ``length`` bytes back to disk now (asynchronously),
    so the final fsync has little left to wait for. On Linux POSIX_FADV_DONTNEED does that for
    dirty pages (and drops the pages once clean: checkpoints are rarely read back)."""
    if hasattr(os, "posix_fadvise"):
        handle.flush()
        os.posix_fadvise(handle.fileno(), handle.tell() - length, length, os.POSIX_FADV_DONTNEED)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """:func:`files.write_bytes_atomic`, a failure (a full disk) raised as the runtime's :class:`CheckpointError`."""
    try:
        files.write_bytes_atomic(path, data)
    except OSError as exc:
        raise CheckpointError(f"could not write {path}: {exc}") from exc


def rest_of(rest_digest: str, trace_digest: str) -> str:
    """``rest_sha256 = sha256(digest(rest) ‖ digest(trace))`` over the raw 32-byte digests, as hex."""
    return hashlib.sha256(bytes.fromhex(rest_digest) + bytes.fromhex(trace_digest)).hexdigest()


def _hash(fn: Callable[..., T], *args: Buffers, inline: bool) -> Future[T]:
    """Run a hash beside the writes (its chunks spread over every core), or here for small data."""
    if not inline:
        return _HASHERS.submit(fn, *args)
    future: Future[T] = Future()
    future.set_result(fn(*args))
    return future


def _digests(weights: Buffers, rest: Buffers, trace: Buffers) -> tuple[str, str, str]:
    return file_digest(weights), file_digest(rest), file_digest(trace, parallel=False)


def write_segment(
    root: Path,
    index: int,
    state: TrainState,
    trace: Mapping[str, torch.Tensor],
    *,
    job_id: str,
    recipe: str,
    step: int,
    k: int,
) -> SegmentManifest:
    """Write segment ``index`` (S_index and its trace) straight from the tensors, and publish it.

    A state that is not serializable raises :class:`CanonicalError` before the disk is touched.
    """
    return write_segment_bytes(
        root, index, views(state.weights), views(state.rest), views(trace), job_id=job_id, recipe=recipe, step=step, k=k
    )


def write_segment_bytes(
    root: Path,
    index: int,
    weights: Buffers,
    rest: Buffers,
    trace: Buffers,
    *,
    job_id: str,
    recipe: str,
    step: int,
    k: int,
    device: str = "cpu",
    keep: bool = True,
) -> SegmentManifest:
    """Write segment ``index`` from the canonical bytes of its three files, and publish it atomically.

    The chunk digests are computed on worker threads over the same memory the writer reads, so the
    cost is about ``max(write, hash)``. With ``keep=False`` the files are hashed and not written: the
    segment is its manifest alone. An I/O failure (a full disk) raises :class:`CheckpointError` and
    leaves every earlier segment as it was.
    """
    parts = {WEIGHTS: weights, REST: rest, DECISIONS: trace}
    inline = not keep or sum(len(view) for buffers in parts.values() for view in buffers) < _PARALLEL_HASH_BYTES
    digests = _hash(_digests, weights, rest, trace, inline=inline)
    final = segment_dir(root, index)
    tmp = final.with_name(f".{final.name}.tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if keep:
            sizes = {name: _write_views(tmp / name, buffers) for name, buffers in parts.items()}
        else:
            sizes = {name: sum(len(view) for view in buffers) for name, buffers in parts.items()}
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"could not write segment {index} in {tmp}: {exc}") from exc
    finally:
        weights_sha, rest_file_sha, trace_sha = digests.result()
    rest_sha = rest_of(rest_file_sha, trace_sha)
    shas = {WEIGHTS: weights_sha, REST: rest_file_sha, DECISIONS: trace_sha}
    manifest = SegmentManifest(
        job_id=job_id, recipe=recipe, segment=index, step=step, k=k,
        files={name: FileEntry(sha256=shas[name], bytes=sizes[name]) for name in parts},
        weights_sha256=weights_sha, rest_sha256=rest_sha, leaf=leaf_of(weights_sha, rest_sha),
        device=None if device == "cpu" else device, kept=keep,
    )
    try:
        text = json.dumps(manifest.model_dump(exclude_none=True, exclude_defaults=False), sort_keys=True, indent=2) + "\n"
        _write_views(tmp / MANIFEST, [text.encode("utf-8")])
        _fsync_all([tmp / name for name in ((*parts, MANIFEST) if keep else (MANIFEST,))])
        _fsync(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync(final.parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"could not publish segment {index} at {final}: {exc}") from exc
    return manifest


def _read_checked(directory: Path, name: str, entry: FileEntry) -> bytes:
    path = directory / name
    try:
        data = files.read_regular(path, entry.bytes)
    except files.HostileFile as exc:
        raise CheckpointError(f"checkpoint file {path} is refused: {exc.reason}") from None
    except OSError as exc:
        raise CheckpointError(f"checkpoint file {path} is missing: {exc}") from exc
    if len(data) != entry.bytes:
        raise CheckpointError(f"checkpoint file {path} is truncated or extended: {len(data)} bytes, manifest says {entry.bytes}")
    if file_digest([data]) != entry.sha256:
        raise CheckpointError(f"checkpoint file {path} does not match its manifest digest (tampered or corrupt)")
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
    """Read and verify one segment: sizes and hashes against the manifest, the leaf, canonical form."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    if set(manifest.files) != {WEIGHTS, REST, DECISIONS}:
        raise CheckpointError(f"{directory / MANIFEST} must list exactly {WEIGHTS}, {REST} and {DECISIONS}")
    if not manifest.kept:
        raise CheckpointError(f"segment {manifest.segment} was not kept ({directory} holds its leaf only)")
    raw = {name: _read_checked(directory, name, entry) for name, entry in manifest.files.items()}
    rest_sha = rest_of(manifest.files[REST].sha256, manifest.files[DECISIONS].sha256)
    weights_sha = manifest.files[WEIGHTS].sha256
    if (manifest.weights_sha256, manifest.rest_sha256, manifest.leaf) != (weights_sha, rest_sha, leaf_of(weights_sha, rest_sha)):
        raise CheckpointError(f"{directory / MANIFEST} has hashes or a leaf that do not match its files")
    try:
        parsed = {name: deserialize(data) for name, data in raw.items()}
    except CanonicalError as exc:
        raise CheckpointError(f"{directory} holds a file that is not canonical safetensors: {exc}") from exc
    return LoadedSegment(directory, manifest, TrainState(weights=parsed[WEIGHTS], rest=parsed[REST]), parsed[DECISIONS])
