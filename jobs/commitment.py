"""The executor's commitment to a run: the Merkle root over every segment leaf, and the final weights.

``commitment.json`` holds exactly the canonical JSON bytes (what the hotkey signs)::

    json.dumps({"bundle_sha256", "deterministic", "final_sha256", "format", "job_id", "k", "n", "root"[, "device"]},
               sort_keys=True, separators=(",", ":"), ensure_ascii=True)

with lowercase hex digests and ``n``/``k`` as integers; ``"device": "cuda"`` is there only for a run
trained on a GPU. ``deterministic`` (written by the runtime, absent from commitments made before it
existed) names the environment the run's deterministic mode computed in (``jobs/devices.py``
``fingerprint``: torch's version and, on a GPU, its name and the CUDA, cuDNN and cuBLAS workspace
settings; on a CPU its instruction set): two runs with the same fingerprint reach the same bits, which
the refereed tier relies on (docs/protocol.md §3c). ``n`` is the number of segments, so there are ``n + 1`` leaves ``h_0..h_n``, each over
the chunk digests of S_i's files (``jobs/chunks.py``); ``final_sha256`` is the plain sha256 of
``model.safetensors`` (= the weights file of S_n). ``format`` (2: chunked leaves) is part of the signed
bytes, so another format can never be read as this one; format 1 (whole-file sha256 leaves) and any
format this version does not know are refused with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from .segment_layout import WEIGHTS, read_manifest, segment_dir
from .files import HostileFile, read_regular
from .merkle import inclusion_proof, merkle_root

FILENAME = "commitment.json"
FORMAT = 2
"""The commitment format this version writes and reads (2: leaves over chunk digests)."""
RETIRED = {1: "format 1 commits whole-file sha256 leaves, which cannot open one chunk of a state; this version "
              "reads format 2 (chunked leaves, docs/runtime.md): re-run the job with the current runtime"}
MAX_BYTES = 4096
"""A canonical commitment is about 300 bytes (three digests, a job id, two integers); a job id long
enough to need more is not one a broker issued. The size is checked before a byte is read."""
Hex64 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class CommitmentError(ValueError):
    """A commitment file that is malformed or not in canonical form."""


class Commitment(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    format: Literal[2] = FORMAT
    job_id: str
    bundle_sha256: Hex64
    root: Hex64
    final_sha256: Hex64
    n: Annotated[StrictInt, Field(ge=0)]
    k: Annotated[StrictInt, Field(ge=1)]
    deterministic: Annotated[str, Field(pattern=r"^[ -~]{1,200}$")] | None = None
    """Where the run computed in the runtime's deterministic mode (``jobs/devices.py`` ``fingerprint``):
    printable ASCII, at most 200 characters. Signed with the rest; the refereed tier compares two
    executors' bits only when their fingerprints agree."""
    device: Literal["cuda"] | None = None
    """The kind of device the executor trained on when it is not the CPU (absent: the CPU). Signed with
    the rest, so the (executor, verifier) pair whose calibration the audit applies is fixed before the
    challenge is drawn (docs/protocol.md §2)."""

    @property
    def device_kind(self) -> str:
        """``cpu`` or ``cuda``."""
        return self.device or "cpu"

    def canonical_json(self) -> bytes:
        """The exact bytes that are written and signed (``device`` and ``deterministic`` only when set)."""
        return json.dumps(
            self.model_dump(exclude_none=True), sort_keys=True, separators=(",", ":"), ensure_ascii=True
        ).encode("ascii")

    @classmethod
    def from_json(cls, data: bytes) -> Commitment:
        """Parse commitment bytes, requiring them to be exactly the canonical JSON."""
        try:
            commitment = cls.model_validate_json(data)
        except ValidationError as exc:
            if any(error["loc"] == ("format",) for error in exc.errors()):
                raise CommitmentError(_format_refusal(data)) from None
            raise CommitmentError(f"malformed commitment: {_problems(exc)}") from None
        if commitment.canonical_json() != data:
            if b'"format":' not in data:  # the default filled it in: the executor's bytes have no format
                raise CommitmentError(f"commitment format is not {FORMAT}, the one this version reads: it has none")
            raise CommitmentError("commitment is not in canonical JSON form")
        return commitment


def _format_refusal(data: bytes) -> str:
    """Why a commitment of another format is refused (a retired one named with its reason)."""
    import re

    found = re.search(rb'"format":(\d{1,4})[,}]', data)
    if found is not None and int(found[1]) in RETIRED:
        return f"commitment format {int(found[1])} is refused: {RETIRED[int(found[1])]}"
    return f"commitment format is not {FORMAT}, the one this version reads"


def read_commitment(path: Path) -> Commitment:
    """Read (at most :data:`MAX_BYTES`, a regular file, no link followed) and strictly parse a ``commitment.json``."""
    try:
        return Commitment.from_json(read_regular(path, MAX_BYTES, FILENAME))
    except HostileFile as exc:
        raise CommitmentError(exc.reason) from None


def _problems(exc: ValidationError) -> str:
    """What is wrong, field by field, without the input's values (a commitment's bytes are never echoed)."""
    found = exc.errors(include_input=False, include_url=False, include_context=False)
    shown = [f"{'.'.join(map(str, e['loc'])) or 'the JSON'}: {e['msg']}" for e in found[:5]]
    return "; ".join(shown) + (f"; and {len(found) - 5} more" if len(found) > 5 else "")


def segment_leaves(checkpoint_dir: Path, n: int) -> list[bytes]:
    """The leaves ``h_0..h_n`` recorded in the segment manifests, as raw digests."""
    return [bytes.fromhex(read_manifest(segment_dir(checkpoint_dir, i)).leaf) for i in range(n + 1)]


def build_commitment(
    checkpoint_dir: Path, *, job_id: str, bundle_sha256: str, n: int, k: int, final_sha256: str | None = None,
    record_environment: bool = False,
) -> Commitment:
    """The commitment over the segments 0..n on disk (``final_sha256``: sha256 of S_n's weights file, read
    from disk when not given); ``device`` is ``cuda`` when any of them was trained on a GPU. With
    ``record_environment`` (the runtime's own commitment) ``deterministic`` is this process's fingerprint
    for that device kind."""
    if final_sha256 is None:
        import hashlib

        final_sha256 = hashlib.sha256((segment_dir(checkpoint_dir, n) / WEIGHTS).read_bytes()).hexdigest()
    manifests = [read_manifest(segment_dir(checkpoint_dir, i)) for i in range(n + 1)]
    root = merkle_root([bytes.fromhex(m.leaf) for m in manifests]).hex()
    device = "cuda" if any(m.device == "cuda" for m in manifests) else None
    deterministic = None
    if record_environment:
        from .devices import fingerprint

        deterministic = fingerprint(device or "cpu")
    return Commitment(
        job_id=job_id, bundle_sha256=bundle_sha256, root=root, final_sha256=final_sha256, n=n, k=k, device=device,
        deterministic=deterministic,
    )


def segment_proof(checkpoint_dir: Path, n: int, index: int) -> list[str]:
    """The inclusion proof of leaf ``index`` in the tree of ``n + 1`` leaves (hex), for an opening."""
    return [h.hex() for h in inclusion_proof(segment_leaves(checkpoint_dir, n), index)]
