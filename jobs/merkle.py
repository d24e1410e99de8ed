"""RFC 6962 Merkle Tree Hash over the segment leaves, inclusion proofs, and their verification.

The leaf data are the raw 32-byte segment hashes ``h_0..h_n``. Leaf hashes are
``sha256(0x00 || data)``, interior nodes ``sha256(0x01 || left || right)``, and a tree of ``n > 1``
leaves splits at the largest power of two smaller than ``n`` (RFC 6962 §2.1). Proof verification
follows RFC 9162 §2.1.3.2. All hashes are raw bytes; the commitment stores them as lowercase hex.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def leaf_hash(data: bytes) -> bytes:
    """``sha256(0x00 || data)``."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """``sha256(0x01 || left || right)``."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(size: int) -> int:
    """The largest power of two strictly smaller than ``size`` (``size > 1``)."""
    return 1 << ((size - 1).bit_length() - 1)


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """MTH(D[n]); the hash of the empty string for an empty list."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaf_hash(leaves[0])
    k = _split(len(leaves))
    return node_hash(merkle_root(leaves[:k]), merkle_root(leaves[k:]))


def inclusion_proof(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """PATH(index, D[n]): the sibling hashes from the leaf up to the root."""
    if not 0 <= index < len(leaves):
        raise IndexError(f"leaf {index} is outside a tree of {len(leaves)} leaves")
    if len(leaves) == 1:
        return []
    k = _split(len(leaves))
    if index < k:
        return inclusion_proof(leaves[:k], index) + [merkle_root(leaves[k:])]
    return inclusion_proof(leaves[k:], index - k) + [merkle_root(leaves[:k])]


def verify_inclusion(leaf: bytes, index: int, tree_size: int, proof: Sequence[bytes], root: bytes) -> bool:
    """Whether ``proof`` shows leaf data ``leaf`` at ``index`` in the tree of ``tree_size`` with ``root``."""
    if not 0 <= index < tree_size:
        return False
    fn, sn, r = index, tree_size - 1, leaf_hash(leaf)
    for sibling in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(sibling, r)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, sibling)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root


def path_nodes(leaf: bytes, index: int, tree_size: int, proof: Sequence[bytes]) -> dict[tuple[int, int], bytes] | None:
    """The hash of every node on leaf ``index``'s path to the root and of every sibling beside it, keyed by the
    node's leaf range ``(first, end)``, computed from ``proof`` (RFC 6962 ``PATH``, siblings from the leaf up);
    None when the proof's length does not fit a tree of ``tree_size``. The root is ``(0, tree_size)``: once it
    equals the committed root, every node returned is the committed one (the refereed tier's bisection reads
    two trees' subtrees from one opened leaf each)."""
    if not 0 <= index < tree_size:
        return None
    remaining = list(proof)
    nodes: dict[tuple[int, int], bytes] = {}

    def down(lo: int, hi: int) -> bytes | None:
        if hi - lo == 1:
            nodes[(lo, hi)] = leaf_hash(leaf)
            return nodes[(lo, hi)]
        if not remaining:
            return None
        sibling = remaining.pop()  # the highest sibling is the proof's last hash
        split = lo + _split(hi - lo)
        if index < split:
            nodes[(split, hi)] = sibling
            below = down(lo, split)
            found = None if below is None else node_hash(below, sibling)
        else:
            nodes[(lo, split)] = sibling
            below = down(split, hi)
            found = None if below is None else node_hash(sibling, below)
        if found is not None:
            nodes[(lo, hi)] = found
        return found

    return nodes if down(0, tree_size) is not None and not remaining else None
