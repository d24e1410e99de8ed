"""Chunks of every boundary, drawn after the commitment and opened with proofs (the "sampled" tier).

docs/protocol.md §3b. The draw is a function of the commitment's root and the challenged segments (which
the executor learns only after it committed, from the broker's secret), so no extra round trip is
needed and the executor cannot foresee it::

    seed        = sha256(b"trainmaster-boundary-chunks-v1\\0" ‖ root (32 raw bytes) ‖ u32be(i) for each challenged i, sorted)
    block j     = sha256(seed ‖ u64be(j)), j = 0, 1, …  (a byte stream)
    per segment s = 0..n−1, in order:  c weights chunk indices (uniform below the weights file's chunk count,
                  rejection-sampled from u64s), then c u64 "moment positions"

For each boundary b = 0..n the executor opens, from S_b's files (``boundary_opening``): the weights
chunks drawn for segments b−1 and b; from the rest file the chunks holding its header, every ``runtime/``
entry but the RNG states, the first ``*/state/*/step`` counter of each optimizer, and, for each moment
position u of segments b−1 and b, the element ``⌊u·E / 2^64⌋`` of the optimizer's second moments
(``*/state/*/exp_avg_sq`` in name order, E elements in all); each chunk with its proof against its
file's digest, the three digests, and the leaf's proof against the root. Written as JSON (chunk bytes in
base64) to ``chunks/<b as 8 digits>.json`` in the openings folder.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .canonical import CanonicalError, _entry_layout, _header, bounded_json
from .chunks import CHUNK_BYTES, ChunkTree, chunk_count, file_digest
from .checkpoint import DECISIONS, REST, WEIGHTS, read_manifest, segment_dir
from .merkle import inclusion_proof

DOMAIN = b"trainmaster-boundary-chunks-v1\x00"
CHUNKS_DIR = "chunks"
DEFAULT_PER_SEGMENT = 2
"""c: weights chunks and moment positions drawn per segment."""
MAX_OPENING_BYTES = 16 * 1024 * 1024
"""One boundary's opening JSON (a few dozen 64 KiB chunks in base64)."""
MOMENTS = "/exp_avg_sq"
STEP = "/step"


@dataclass(frozen=True)
class SegmentDraw:
    weights: tuple[int, ...]
    moments: tuple[int, ...]


def draw(root_hex: str, segments: Iterable[int], n: int, weights_length: int, c: int = DEFAULT_PER_SEGMENT) -> list[SegmentDraw]:
    """The draw of every segment 0..n−1 (see the module docstring)."""
    seed = hashlib.sha256(DOMAIN + bytes.fromhex(root_hex) + b"".join(struct.pack(">I", i) for i in sorted(set(segments)))).digest()
    stream = _Stream(seed)
    count = max(1, chunk_count(weights_length))
    return [SegmentDraw(tuple(stream.below(count) for _ in range(c)), tuple(stream.u64() for _ in range(c))) for _ in range(n)]


class _Stream:
    def __init__(self, seed: bytes):
        self.seed, self.counter, self.buffer = seed, 0, b""

    def u64(self) -> int:
        while len(self.buffer) < 8:
            self.buffer += hashlib.sha256(self.seed + self.counter.to_bytes(8, "big")).digest()
            self.counter += 1
        value, self.buffer = int.from_bytes(self.buffer[:8], "big"), self.buffer[8:]
        return value

    def below(self, bound: int) -> int:
        limit = 2**64 - 2**64 % bound
        while (value := self.u64()) >= limit:
            pass
        return value % bound


@dataclass(frozen=True)
class Layout:
    """Where each entry of a canonical file lies: ``name -> (dtype, shape, begin, end)``, offsets in the file."""

    entries: dict[str, tuple[torch.dtype, list[int], int, int]]
    header_bytes: int

    @classmethod
    def parse(cls, prefix: bytes, length: int) -> Layout:
        """From the first bytes of a canonical file of ``length`` bytes (at least its header), strictly:
        the header must be exactly the canonical one of the entries it lists, and index ``length`` bytes."""
        if len(prefix) < 8:
            raise CanonicalError("truncated: no header length")
        (size,) = struct.unpack_from("<Q", prefix)
        if size > 16 * 1024 * 1024 or 8 + size > len(prefix):
            raise CanonicalError(f"header length {size} is out of bounds")
        raw = bytes(prefix[8 : 8 + size])
        if b"\\" in raw:
            raise CanonicalError("header holds escape sequences: not canonical")
        header = bounded_json(raw, max_depth=3, what="header")
        from .canonical import FORMAT

        if not isinstance(header, dict) or header.pop("__metadata__", None) != {"format": FORMAT}:
            raise CanonicalError(f"header does not declare format {FORMAT}")
        available = length - 8 - size
        layout = {name: _entry_layout(name, entry, available) for name, entry in sorted(header.items())}
        if _header((name, dt, shape) for name, (dt, shape, _, _) in layout.items()) != bytes(prefix[: 8 + size]):
            raise CanonicalError("header is not in canonical form")
        if sum(e - b for _, _, b, e in layout.values()) != available:
            raise CanonicalError("the header does not index the whole file")
        start = 8 + size
        return cls({n: (dt, shape, start + b, start + e) for n, (dt, shape, b, e) in layout.items()}, start)

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor]) -> Layout:
        from .canonical import canonical_tensors, header_bytes

        tensors = canonical_tensors(tensors)
        head = header_bytes(tensors)
        return cls.parse(head, len(head) + sum(t.numel() * t.element_size() for t in tensors.values()))

    def header_chunks(self) -> list[int]:
        return list(range(chunk_count(self.header_bytes)))

    def entry_chunks(self, name: str) -> list[int]:
        _, _, begin, end = self.entries[name]
        return list(range(begin // CHUNK_BYTES, max(begin, end - 1) // CHUNK_BYTES + 1)) if end > begin else []

    def moment_element(self, u: int) -> tuple[str, int] | None:
        """The second-moment entry and element index position ``u`` (a u64) selects, or None without moments."""
        names = [n for n in self.entries if n.endswith(MOMENTS)]
        sizes = [math.prod(self.entries[n][1]) for n in names]
        total = sum(sizes)
        if not total:
            return None
        e = (u * total) >> 64
        for name, size in zip(names, sizes, strict=True):
            if e < size:
                return name, e
            e -= size
        return None

    def element_chunks(self, name: str, index: int) -> list[int]:
        dtype, _, begin, _ = self.entries[name]
        first = begin + index * dtype.itemsize
        return sorted({first // CHUNK_BYTES, (first + dtype.itemsize - 1) // CHUNK_BYTES})

    def exact_entries(self) -> list[str]:
        """The ``runtime/`` entries but the RNG states, and the first step counter of each optimizer."""
        names = [n for n in self.entries if n.startswith("runtime/") and not n.startswith("runtime/rng/")]
        prefixes: dict[str, str] = {}
        for n in self.entries:
            if n.endswith(STEP) and "/state/" in n:
                prefixes.setdefault(n.split("/state/")[0], n)
        return names + sorted(prefixes.values())

    def values(self, name: str, chunks: Mapping[int, bytes]) -> tuple[int, torch.Tensor] | None:
        """The longest run of ``name``'s elements held whole by consecutive opened ``chunks``: (first element, values)."""
        dtype, shape, begin, end = self.entries[name]
        if end == begin:
            return 0, torch.empty(shape, dtype=dtype)
        item = dtype.itemsize
        runs, lo = [], None
        for j in range(begin // CHUNK_BYTES, (end - 1) // CHUNK_BYTES + 1):
            if j in chunks and lo is None:
                lo = j
            if j not in chunks and lo is not None:
                runs.append((lo, j))
                lo = None
        if lo is not None:
            runs.append((lo, (end - 1) // CHUNK_BYTES + 1))
        best = None
        for a, b in runs:
            data = b"".join(chunks[j] for j in range(a, b))
            lo_byte, hi_byte = max(begin, a * CHUNK_BYTES), min(end, a * CHUNK_BYTES + len(data))
            first = -(-(lo_byte - begin) // item)
            last = (hi_byte - begin) // item
            if last <= first:
                continue
            raw = data[begin + first * item - a * CHUNK_BYTES : begin + last * item - a * CHUNK_BYTES]
            tensor = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype)
            if best is None or tensor.numel() > best[1].numel():
                best = (first, tensor)
        if best is not None and best[1].numel() == math.prod(shape):
            return 0, best[1].reshape(shape)
        return best


def wanted_chunks(b: int, n: int, draws: Sequence[SegmentDraw], weights_count: int, rest: Layout) -> tuple[list[int], list[int]]:
    """The weights and rest chunks boundary ``b`` opens."""
    segments = [s for s in (b - 1, b) if 0 <= s < n]
    weights = sorted({j for s in segments for j in draws[s].weights if j < weights_count})
    chunks = set(rest.header_chunks())
    for name in rest.exact_entries():
        chunks.update(rest.entry_chunks(name))
    for s in segments:
        for u in draws[s].moments:
            if (found := rest.moment_element(u)) is not None:
                chunks.update(rest.element_chunks(*found))
    return weights, sorted(chunks)


def boundary_opening(checkpoint_dir: Path, b: int, n: int, draws: Sequence[SegmentDraw], leaves: Sequence[bytes]) -> dict:
    """The executor's opening of boundary ``b`` (its state files must be on disk)."""
    folder = segment_dir(checkpoint_dir, b)
    weights, rest, trace = ((folder / name).read_bytes() for name in (WEIGHTS, REST, DECISIONS))
    w_tree, r_tree = ChunkTree([weights]), ChunkTree([rest])
    w_chunks, r_chunks = wanted_chunks(b, n, draws, w_tree.count, Layout.parse(rest[: 8 + struct.unpack_from("<Q", rest)[0]], len(rest)))
    return {
        "boundary": b,
        "weights": {"digest": w_tree.digest, "length": w_tree.length},
        "rest": {"digest": r_tree.digest, "length": r_tree.length},
        "trace_digest": file_digest([trace]),
        "leaf_proof": [h.hex() for h in inclusion_proof(leaves, b)],
        "chunks": [
            {"file": name, "index": j, "data": base64.b64encode(tree.chunk(j)).decode("ascii"), "proof": tree.proof(j)}
            for name, tree, wanted in (("weights", w_tree, w_chunks), ("rest", r_tree, r_chunks))
            for j in wanted
        ],
    }


def write_openings(checkpoint_dir: Path, segments: Sequence[int], out_dir: Path, c: int = DEFAULT_PER_SEGMENT) -> int:
    """Write the opening of every boundary 0..n into ``out_dir/chunks/``; returns n + 1. The states must all be on disk."""
    from .merkle import merkle_root

    manifests = []
    i = 0
    while (segment_dir(checkpoint_dir, i) / "manifest.json").is_file():
        manifests.append(read_manifest(segment_dir(checkpoint_dir, i)))
        i += 1
    n = len(manifests) - 1
    leaves = [bytes.fromhex(m.leaf) for m in manifests]
    root = merkle_root(leaves).hex()
    weights_length = manifests[0].files[WEIGHTS].bytes
    draws = draw(root, segments, n, weights_length, c)
    target = Path(out_dir) / CHUNKS_DIR
    target.mkdir(parents=True, exist_ok=True)
    for b in range(n + 1):
        data = json.dumps(boundary_opening(checkpoint_dir, b, n, draws, leaves), sort_keys=True).encode("ascii")
        (target / f"{b:08d}.json").write_bytes(data)
    return n + 1


__all__ = ["Layout", "SegmentDraw", "boundary_opening", "draw", "wanted_chunks", "write_openings"]
