"""A runtime job's committed segments where a backend keeps them on a filesystem: `<checkpoints>/segments/<index>/`
(each with its `manifest.json`), as the local backend keeps them in an attempt's work dir, the Ray backend in its
synced folder and the reference miner in its attempts' work dirs.

What the broker asks of a backend that keeps segments (`KeepsSegments`, `ReleasesSegments`,
`ResumesFromCheckpoints` in backends/features.py) is answered from here: the newest segment (its index and step,
read from its manifest as bounded JSON, never through `jobs.checkpoint`, which imports torch), the challenged
ones copied out for the audit, those held, and the release of those no longer needed. Links the job left are
never followed: a linked `checkpoints/` or `segments/` holds nothing, a linked entry is removed as a link.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

from trainmaster.backends import transfer
from trainmaster.backends.features import HeldSegment
from trainmaster.jobs.files import HostileFile, read_regular, tree_bytes, write_bytes_atomic


async def copy_segments(checkpoints: Path, indices: list[int], dest: Path, *, boundaries: bool = True) -> Path:
    """Every segment's manifest under the runtime's checkpoint directory `checkpoints`, and the whole of each
    segment of `indices` and of the one after it, copied into `dest` laid out the same (hashed as they go);
    returns `dest`. States the run hashed but did not keep are first re-made from the nearest kept one
    (backends/segment_reopen.py). `boundaries`: also the sampled tier's chunks of every boundary."""
    from trainmaster.backends.segment_reopen import open_boundaries, reopen_dropped

    await reopen_dropped(checkpoints, indices)
    if boundaries:
        await open_boundaries(checkpoints, indices, dest)
    source = checkpoints / "segments"
    wanted = set(indices) | {i + 1 for i in indices}
    names = await asyncio.to_thread(lambda: sorted(p.name for p in source.iterdir() if p.name.isdigit())
                                    if source.is_dir() and not source.is_symlink() else [])
    for name in names:
        here, there = source / name, dest / "segments" / name
        if int(name) in wanted:
            await transfer.copy_tree(here, there)
        else:
            await asyncio.to_thread(_copy_manifest, here / "manifest.json", there / "manifest.json")
    return dest


def _copy_manifest(source: Path, target: Path) -> None:
    """A segment manifest (a few hundred bytes; read bounded, never through a link), written atomically."""
    try:
        data = read_regular(source, 2**16)
    except (FileNotFoundError, HostileFile):
        return  # a segment half-written by a kill: the audit says what is missing
    target.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(target, data)


class LeavesUnreadable(ValueError):
    """The run's segment manifests do not give its leaves (a half-written run, a manifest that is not one)."""


def leaf_openings(checkpoints: Path, indices: list[int]) -> list[dict]:
    """The leaves `indices` of the run under `checkpoints` for the refereed tier's bisection: each one's chunk
    digests (`weights`, `rest`, `trace`) read from its manifest (bounded JSON, never `jobs.checkpoint`, which
    imports torch) and its inclusion proof over every leaf the manifests hold (backends/features.py
    `LeafOpening`). Raises LeavesUnreadable."""
    from trainmaster.jobs.merkle import inclusion_proof

    base = Path(checkpoints) / "segments"
    if base.is_symlink() or not base.is_dir():
        raise LeavesUnreadable("the run has no segments")
    names = sorted(p.name for p in base.iterdir() if p.name.isascii() and p.name.isdigit())
    manifests = []
    for i, name in enumerate(names):
        if int(name) != i:
            raise LeavesUnreadable(f"segment {i} is missing")
        try:
            manifest = json.loads(read_regular(base / name / "manifest.json", 2**16))
            files = manifest["files"]
            digests = {part: files[f"{part}.safetensors"]["sha256"] for part in ("weights", "rest", "decisions")}
            bytes.fromhex(manifest["leaf"])
        except (OSError, ValueError, KeyError, TypeError, HostileFile) as exc:
            raise LeavesUnreadable(f"segment {i}'s manifest: {type(exc).__name__}: {exc}") from None
        manifests.append((bytes.fromhex(manifest["leaf"]), digests))
    leaves = [leaf for leaf, _ in manifests]
    out = []
    for index in indices:
        if not 0 <= index < len(leaves):
            raise LeavesUnreadable(f"leaf {index} is outside the run's {len(leaves)} leaves")
        digests = manifests[index][1]
        out.append({"index": index, "weights": digests["weights"], "rest": digests["rest"],
                    "trace": digests["decisions"], "proof": [h.hex() for h in inclusion_proof(leaves, index)]})
    return out


def newest_segment(checkpoints: Path) -> tuple[int, int] | None:
    """(index, step) of the newest segment under `checkpoints` whose manifest reads (as JSON, bounded: never
    `jobs.checkpoint`, which imports torch); None when there is none."""
    base = Path(checkpoints) / "segments"
    indices = sorted((int(p.name) for p in base.iterdir() if p.name.isdigit()), reverse=True) if base.is_dir() else []
    for i in indices:
        try:
            step = json.loads(read_regular(base / f"{i:08d}" / "manifest.json", 2**16))["step"]
        except (OSError, ValueError, KeyError, TypeError, HostileFile):
            continue
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            return i, step
    return None


def segments_dir(workdir: Path) -> Path | None:
    """The attempt's `checkpoints/segments/`; None when there is none, or when the job replaced a folder on
    that path by a link (never followed: releasing must not delete what lies outside the work dir)."""
    base = workdir
    for part in ("checkpoints", "segments"):
        base = base / part
        if base.is_symlink() or not base.is_dir():
            return None
    return base


def _segment_index(name: str) -> int | None:
    """A segment directory's index (`00000012` → 12); None for anything else (a half-written segment)."""
    return int(name) if name.isascii() and name.isdigit() else None


def held_segments(workdir: Path) -> list[HeldSegment]:
    base = segments_dir(workdir)
    if base is None:
        return []
    return [HeldSegment(index=_segment_index(p.name), bytes=tree_bytes(p)) for p in sorted(base.iterdir())]


def release_segments(workdir: Path, keep: set[int]) -> int:
    """Remove each entry of the attempt's `checkpoints/segments/` whose index is not in `keep` (half-written
    ones included); links are removed as links. Returns the bytes freed (what is left of an entry that could
    not be removed is not counted), so a second call frees and returns nothing."""
    base = segments_dir(workdir)
    if base is None:
        return 0
    freed = 0
    for entry in sorted(base.iterdir()):
        index = _segment_index(entry.name)
        if index is not None and index in keep:
            continue
        before = tree_bytes(entry)
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            try:
                entry.unlink()
            except FileNotFoundError:
                pass
        freed += before - tree_bytes(entry)
    return freed
