"""Chunk digests: a file's canonical bytes as a Merkle tree over fixed-size chunks, hashed on every core.

docs/runtime.md, "Leaf hash". A file ``F`` of ``L`` bytes is cut into ``c = ceil(L / CHUNK_BYTES)``
chunks ``F[j·C : (j+1)·C]`` (the last one shorter; none for an empty file), and::

    digest(F) = sha256(b"trainmaster-chunks-v1\\x00" ‖ u64le(L) ‖ MTH(chunk_0, …, chunk_{c−1}))

with ``MTH`` the RFC 6962 tree of ``jobs/merkle.py`` (leaf ``sha256(0x00 ‖ chunk)``, node
``sha256(0x01 ‖ l ‖ r)``, ``MTH({}) = sha256("")``). Binding ``L`` fixes the tree's size, so a
proof for chunk j (``jobs/merkle.py``'s ``PATH``) opens that chunk of that file alone.

The chunk hashes are independent, so they are computed by a pool of threads over contiguous runs of
chunks (``hashlib`` releases the GIL on buffers over 2 KiB): the whole machine hashes a checkpoint,
where one sha256 stream ran on one core. The tree is then built level by level (bottom-up pairing,
an odd last node carried up unchanged, which is RFC 6962's tree for any size).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from .cpus import usable_cpus
from .merkle import leaf_hash, node_hash, verify_inclusion
from .priority import lower_thread_priority

CHUNK_BYTES = 64 * 1024
"""The chunk size: 16,384 float32 values, about 30 µs of sha256; a proof for a 1.2 GB state is 15 hashes."""
DOMAIN = b"trainmaster-chunks-v1\x00"
_RUN = 64
"""Chunks hashed per task (4 MiB): amortises the pool's overhead."""
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        workers = min(32, usable_cpus())
        _POOL = ThreadPoolExecutor(workers, thread_name_prefix="trainmaster-chunk", initializer=lower_thread_priority)
    return _POOL


class Joined:
    """Byte views read as one contiguous stream (a file written from several buffers)."""

    def __init__(self, views: Sequence[bytes | bytearray | memoryview]):
        self.views = [memoryview(v).cast("B") if not isinstance(v, memoryview) or v.format != "B" else v for v in views]
        self.starts, total = [], 0
        for view in self.views:
            self.starts.append(total)
            total += len(view)
        self.length = total

    def piece(self, begin: int, end: int) -> memoryview | bytes:
        """Bytes ``[begin, end)``: a view when they lie in one buffer, else joined (a copy at a buffer seam only)."""
        parts = []
        for view, start in zip(self.views, self.starts, strict=True):
            lo, hi = max(begin, start), min(end, start + len(view))
            if lo < hi:
                parts.append(view[lo - start : hi - start])
        return parts[0] if len(parts) == 1 else b"".join(parts)


def chunk_count(length: int) -> int:
    return -(-length // CHUNK_BYTES)


def chunk_hashes(views: Sequence[bytes | bytearray | memoryview], *, parallel: bool = True) -> tuple[list[bytes], int]:
    """The RFC 6962 leaf hash of every chunk of the bytes ``views`` hold end to end, and their length."""
    joined = Joined(views)
    count = chunk_count(joined.length)

    def run(first: int) -> list[bytes]:
        last = min(count, first + _RUN)
        out = []
        for j in range(first, last):
            hasher = hashlib.sha256(b"\x00")
            hasher.update(joined.piece(j * CHUNK_BYTES, min(joined.length, (j + 1) * CHUNK_BYTES)))
            out.append(hasher.digest())
        return out

    starts = range(0, count, _RUN)
    if not parallel or count <= _RUN:
        runs = [run(s) for s in starts]
    else:
        runs = list(_pool().map(run, starts))
    return [h for r in runs for h in r], joined.length


def tree_levels(hashes: Sequence[bytes]) -> list[list[bytes]]:
    """Every level of the RFC 6962 tree over already-hashed leaves, leaves first, the root's level last."""
    levels = [list(hashes)]
    while len(levels[-1]) > 1:
        below = levels[-1]
        above = [node_hash(below[i], below[i + 1]) for i in range(0, len(below) - 1, 2)]
        if len(below) % 2:
            above.append(below[-1])
        levels.append(above)
    return levels


def tree_root(hashes: Sequence[bytes]) -> bytes:
    if not hashes:
        return hashlib.sha256(b"").digest()
    return tree_levels(hashes)[-1][0]


def level_proof(levels: Sequence[Sequence[bytes]], index: int) -> list[bytes]:
    """RFC 6962 ``PATH(index)`` from the levels of :func:`tree_levels`."""
    if not levels or not 0 <= index < len(levels[0]):
        raise IndexError(f"chunk {index} is outside a tree of {len(levels[0]) if levels else 0} chunks")
    proof = []
    for level in levels[:-1]:
        sibling = index ^ 1
        if sibling < len(level):
            proof.append(level[sibling])
        index //= 2
    return proof


def digest_of(root: bytes, length: int) -> str:
    """``sha256(DOMAIN ‖ u64le(length) ‖ root)`` as hex: a file's digest from its chunk tree's root."""
    return hashlib.sha256(DOMAIN + struct.pack("<Q", length) + root).hexdigest()


def file_digest(views: Sequence[bytes | bytearray | memoryview], *, parallel: bool = True) -> str:
    """The digest of the bytes ``views`` hold end to end (see the module docstring)."""
    hashes, length = chunk_hashes(views, parallel=parallel)
    return digest_of(tree_root(hashes), length)


class ChunkTree:
    """A file's chunk tree, for opening chunks with proofs."""

    def __init__(self, views: Sequence[bytes | bytearray | memoryview]):
        self.joined = Joined(views)
        hashes, self.length = chunk_hashes(views)
        self.levels = tree_levels(hashes) if hashes else [[]]
        self.digest = digest_of(tree_root(hashes), self.length)

    @property
    def count(self) -> int:
        return chunk_count(self.length)

    def chunk(self, index: int) -> bytes:
        if not 0 <= index < self.count:
            raise IndexError(f"chunk {index} is outside 0..{self.count - 1}")
        return bytes(self.joined.piece(index * CHUNK_BYTES, min(self.length, (index + 1) * CHUNK_BYTES)))

    def proof(self, index: int) -> list[str]:
        return [h.hex() for h in level_proof(self.levels, index)]


def verify_chunk(data: bytes, index: int, length: int, proof: Sequence[str], digest: str) -> bool:
    """Whether ``data`` is chunk ``index`` of a file of ``length`` bytes whose digest is ``digest``."""
    count = chunk_count(length)
    if not 0 <= index < count:
        return False
    expected = min(CHUNK_BYTES, length - index * CHUNK_BYTES)
    if len(data) != expected:
        return False
    try:
        path = [bytes.fromhex(p) for p in proof]
    except (TypeError, ValueError):
        return False
    # The root the proof leads to, then the digest it gives: verify_inclusion needs the root itself,
    # so rebuild it with the same walk and compare digests.
    root = _root_from_path(data, index, count, path)
    return root is not None and digest_of(root, length) == digest and verify_inclusion(data, index, count, path, root)


def _root_from_path(data: bytes, index: int, size: int, path: Sequence[bytes]) -> bytes | None:
    """RFC 9162 §2.1.3.2's walk: the root ``path`` leads to from leaf ``data`` at ``index`` of ``size``."""
    fn, sn, r = index, size - 1, leaf_hash(data)
    for sibling in path:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            r = node_hash(sibling, r)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, sibling)
        fn, sn = fn >> 1, sn >> 1
    return r if sn == 0 else None
