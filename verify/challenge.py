"""The audit challenge: which segments the executor must open, drawn only after it has committed.

docs/protocol.md §3. The draw is a function of ``(secret, root)`` alone::

    seed      = HMAC-SHA256(secret, root)                 root as its 32 raw bytes
    block j   = HMAC-SHA256(seed, b"trainmaster-challenge-v1" || j as u64 big-endian),  j = 0, 1, …
    below(b)  = next 8 stream bytes as a big-endian u64 x, redrawn while x ≥ 2^64 − 2^64 mod b; x mod b
    draw      = a partial Fisher–Yates shuffle of [1, …, n−2]: for i < q, swap pool[i] with
                pool[i + below(len(pool) − i)]; the first q entries are the random segments
    segments  = sorted({0} ∪ {n−tail, …, n−1} ∪ draw)   draw from 1..n−tail−1 (1..n−2 for tail = 1)          tail = the spec's verification.tail_segments (L, default 1)

so anyone holding the revealed secret can recompute it, and the executor, who never holds the secret
before committing, cannot (the secret itself: :mod:`~trainmaster.verify.challenge_secret`). Segments
are never chosen by update magnitude.

The auditor gets a challenge only through :meth:`Challenge.for_commitment`, which takes a
:class:`~trainmaster.verify.commitments.StoredCommitment` — and one of those exists only after the
commitment's signature has been verified and the commitment written to the database.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from math import comb

from .commitments import StoredCommitment

DOMAIN = b"trainmaster-challenge-v1"
_ROOT = re.compile(r"[0-9a-f]{64}")


def challenge_seed(secret: bytes, root_hex: str) -> bytes:
    """``HMAC-SHA256(secret, root)`` over the root's 32 raw bytes."""
    if not _ROOT.fullmatch(root_hex):
        raise ValueError(f"root must be 64 lowercase hex digits, got {root_hex!r}")
    if len(secret) < 16:
        raise ValueError("the challenge secret must be at least 16 bytes")
    return hmac.new(secret, bytes.fromhex(root_hex), hashlib.sha256).digest()


class _Stream:
    """The deterministic byte stream of a seed, and uniform integers from it."""

    def __init__(self, seed: bytes):
        self._seed, self._counter, self._buffer = seed, 0, b""

    def _take(self, size: int) -> bytes:
        while len(self._buffer) < size:
            block = hmac.new(self._seed, DOMAIN + self._counter.to_bytes(8, "big"), hashlib.sha256).digest()
            self._buffer += block
            self._counter += 1
        out, self._buffer = self._buffer[:size], self._buffer[size:]
        return out

    def below(self, bound: int) -> int:
        """A uniform integer in ``[0, bound)`` (rejection sampling, so no modulo bias)."""
        limit = 2**64 - 2**64 % bound
        while True:
            value = int.from_bytes(self._take(8), "big")
            if value < limit:
                return value % bound


def draw_segments(secret: bytes, root_hex: str, n: int, q: int, tail: int = 1) -> list[int]:
    """The challenged segments of an n-segment run: q distinct ones from 1..n−2, plus 0 and the last
    ``tail`` (n−tail..n−1; 1: n−1 alone), sorted."""
    if n < 0 or q < 0:
        raise ValueError(f"n and q must be non-negative, got n={n}, q={q}")
    stream = _Stream(challenge_seed(secret, root_hex))
    pool = list(range(1, n - max(1, tail)))  # the random draws lie between segment 0 and the tail
    take = min(q, len(pool))
    for i in range(take):
        j = i + stream.below(len(pool) - i)
        pool[i], pool[j] = pool[j], pool[i]
    ends = ({0} | set(range(max(0, n - tail), n))) if n else set()
    return sorted(ends | set(pool[:take]))


def detection_probability(n: int, faked: int, q: int, *, include_ends: bool = False) -> float:
    """Probability that an audit hits at least one of ``faked`` segments placed uniformly among ``n``.

    Default: the q uniform draws alone, ``1 − C(n − faked, q) / C(n, q)`` (the table of docs/protocol.md §9).
    ``include_ends``: the whole audit, q random segments plus the first and last, i.e. q + 2
    distinct segments: ``1 − C(n − faked, q + 2) / C(n, q + 2)``.
    """
    if not 0 <= faked <= n:
        raise ValueError(f"faked must be within 0..n, got {faked} of {n}")
    drawn = min(n, q + 2 if include_ends else q)
    return 1.0 - comb(n - faked, drawn) / comb(n, drawn)


@dataclass(frozen=True)
class Challenge:
    """The segments an executor must open for one stored commitment."""

    job_id: str
    attempt_id: str
    root: str
    n: int
    q: int
    segments: tuple[int, ...]

    @classmethod
    def for_commitment(cls, stored: StoredCommitment, secret: bytes, q: int, tail: int = 1) -> Challenge:
        """The challenge of a commitment that was verified and stored (the only way to get one)."""
        if not isinstance(stored, StoredCommitment):
            raise TypeError(
                f"a challenge is drawn only for a StoredCommitment (verified and stored), not a {type(stored).__name__}"
            )
        c = stored.commitment
        return cls(stored.job_id, stored.attempt_id, c.root, c.n, q, tuple(draw_segments(secret, c.root, c.n, q, tail)))

    @property
    def leaves(self) -> tuple[int, ...]:
        """The leaves whose proofs an opening carries: i and i + 1 for each challenged segment i."""
        return tuple(sorted({j for i in self.segments for j in (i, i + 1)}))

    def message(self) -> dict:
        """What is sent to the executor."""
        return {"job_id": self.job_id, "root": self.root, "segments": list(self.segments)}
