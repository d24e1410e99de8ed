"""Which of an untrusted executor's returned files its signed commitment binds: only those are kept.

The commitment (docs/protocol.md §2) binds the final weights by their sha256 (`final_sha256`: the
integrity check refuses a `model.safetensors` with any other hash), itself by its signature, and the
checkpoint segments by the Merkle root over their manifests' leaves (the replay audit opens the
challenged ones against it). Any other file an executor returns (`result.json`, `metrics.jsonl`, a
`model_best.safetensors`) is its own say-so: it is dropped from the stored outputs and listed as
dropped in the verdict's evidence, and the job's metrics come from the broker's own evaluation. The
broker deletes the dropped files only after the verdict: the safety check judges them with the rest, so
a pickle among them still rejects the attempt.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from .pipeline import COMMITMENT_FILE, MODEL_FILE

SEGMENT_FILE = re.compile(r"checkpoints/segments/[0-9]{8}/(weights\.safetensors|rest\.safetensors|"
                          r"decisions\.safetensors|manifest\.json)")
"""A committed segment's files (docs/runtime.md, "Checkpoints on disk"): `segments/<i as 8 digits>/`."""


@dataclass(frozen=True)
class Committed:
    """``kept``: the files the commitment binds; ``dropped``: every other returned file (relative POSIX paths)."""

    kept: tuple[str, ...]
    dropped: tuple[str, ...]


def committed_outputs(paths: Iterable[str]) -> Committed:
    """Split returned files into those bound to the signed commitment and the rest."""
    kept, dropped = [], []
    for path in paths:
        (kept if path in (MODEL_FILE, COMMITMENT_FILE) or SEGMENT_FILE.fullmatch(path) else dropped).append(path)
    return Committed(tuple(kept), tuple(dropped))
