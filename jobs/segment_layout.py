"""The names and manifest of a segment checkpoint on disk, without torch: what reads a checkpoint directory's
layout (the commitment's leaves, the verifier's size limits, a listing of kept segments) imports this alone;
writing and reading the state files is jobs/checkpoint.py's (docs/runtime.md, "Checkpoints on disk")."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from . import files

FORMAT = "trainmaster-checkpoint-v2"
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 2**16
"""A segment manifest lists three files and four digests (under 1 KB); read bounded, as a returned
checkpoint directory is the executor's."""
WEIGHTS = "weights.safetensors"
REST = "rest.safetensors"
DECISIONS = "decisions.safetensors"
SEGMENTS = "segments"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written, or one on disk that is missing, truncated or tampered with."""


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    sha256: str
    """The file's chunk digest (``jobs/chunks.py``; the key keeps its name)."""
    bytes: int


class SegmentManifest(BaseModel):
    """What ``manifest.json`` holds for segment ``segment`` (state S_i at step ``step``, and its trace)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    format: Literal["trainmaster-checkpoint-v2"] = FORMAT
    job_id: str
    recipe: str
    segment: int
    step: int
    k: int
    files: dict[str, FileEntry]
    weights_sha256: str
    rest_sha256: str
    leaf: str
    device: Literal["cuda"] | None = None
    """``cuda`` when S_i was trained on a GPU (absent: the CPU). Not hashed: the commitment carries the
    run's device kind (``jobs/devices.py``); a resumed run reads it back from here."""
    kept: bool = True
    """Whether the state files are on disk; a segment not kept has only this manifest (its leaf)."""


def segment_dir(root: Path, index: int) -> Path:
    return Path(root) / SEGMENTS / f"{index:08d}"


def segment_indices(root: Path) -> list[int]:
    """Indices of the (complete) segments under ``root``, ascending (kept or not)."""
    base = Path(root) / SEGMENTS
    if not base.is_dir():
        return []
    return sorted(int(p.name) for p in base.iterdir() if p.name.isdigit() and (p / MANIFEST).is_file())


def kept_indices(root: Path) -> list[int]:
    """Indices of the segments whose state files are on disk (a resume or a re-run starts from one)."""
    return [i for i in segment_indices(root) if (segment_dir(root, i) / WEIGHTS).is_file()]


def read_manifest(directory: Path) -> SegmentManifest:
    try:
        return SegmentManifest.model_validate_json(files.read_regular(Path(directory) / MANIFEST, MAX_MANIFEST_BYTES))
    except files.HostileFile as exc:
        raise CheckpointError(f"{directory} has no readable manifest: {exc}") from None
    except (OSError, ValidationError) as exc:
        raise CheckpointError(f"{directory} has no readable manifest: {exc}") from exc
