"""The refereed tier's logic (docs/protocol.md §3c): two executors' trees bisected to the first leaf where they
differ, what one replayed segment must settle there, and which side it refutes.

Pure functions over what the broker fetched (no network, no torch: the replay itself is
verify/referee_replay.py, the talking to executors broker/stages/refereeing.py). Nothing an executor opens is
believed before its proof ties it to the root that executor signed:

* **Leaf openings.** For leaf i an executor sends the chunk digests of S_i's weights, rest and the trace of
  segment i, and the leaf's inclusion proof; ``h_i = sha256(weights ‖ sha256(rest ‖ trace))`` must sit at index i
  under its root (:func:`check_opening`), and the proof then also gives the committed hash of every subtree on
  the leaf's path and beside it (``jobs.merkle.path_nodes``).
* **Bisection** (:class:`Bisection`). Both trees have n + 1 leaves, so the same shape. Starting at the root (the
  roots differ), at a node whose two hashes differ the broker has each side open the last leaf of the node's
  left half: that gives both sides' hash of the left half; if they differ the first differing leaf is there,
  else in the right half. After ⌈log₂(n + 1)⌉ openings per side the node is one leaf j: the **first** leaf where
  the trees differ (every leaf before it agrees, since every left subtree passed was equal), found without
  assuming that the runs stay apart once they part.
* **The dispute** (:func:`dispute`). Leaf j − 1 is agreed (both executors committed the same S_{j−1} and
  trace). If the two S_j differ, segment j − 1 is replayed from the agreed S_{j−1} with its agreed trace, and
  each side's S_j (weights and rest digests) is compared with the replay's, bit for bit; if only the traces of
  segment j differ, segment j is replayed from the (agreed) S_j deciding for itself, and each side's trace is
  compared. For j = 0 the reference is the broker's own S_0. A side whose digest is not the replay's is
  **refuted**, one whose digest is, **upheld**. Bit for bit holds when the replay runs where both executors
  said they ran (the commitments' ``deterministic`` fingerprint equals the verifier's); elsewhere the replay
  cannot settle it (**undecided**).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

from trainmaster.jobs.merkle import path_nodes

from .errors import VerificationError

Compared = Literal["initial", "state", "trace"]
"""What the replay settles: S_0 against the broker's own, S_j after replaying segment j − 1, or the trace of
segment j after replaying it."""


class Forfeit(VerificationError):
    """What an executor sent for the bisection does not stand (a wrong index, a proof that does not reach its
    root, malformed digests): it forfeits, as one that does not answer does."""

    def __init__(self, reason: str):
        super().__init__(reason, kind="rejected")


@dataclass(frozen=True)
class OpenedLeaf:
    """A leaf tied to its root: its index, its three chunk digests and h_i (lowercase hex)."""

    index: int
    weights: str
    rest: str
    trace: str
    leaf: str

    @property
    def state(self) -> tuple[str, str]:
        """S_i's digests (weights, rest) without the trace of segment i."""
        return self.weights, self.rest

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "weights": self.weights, "rest": self.rest, "trace": self.trace,
                "leaf": self.leaf}


def leaf_of(weights: str, rest: str, trace: str) -> str:
    """``h_i = sha256(weights ‖ sha256(rest ‖ trace))`` over the raw 32-byte digests (jobs/checkpoint.py)."""
    rest_sha = hashlib.sha256(bytes.fromhex(rest) + bytes.fromhex(trace)).digest()
    return hashlib.sha256(bytes.fromhex(weights) + rest_sha).hexdigest()


def check_opening(root_hex: str, size: int, index: int, opening: Any) -> tuple[OpenedLeaf, dict[tuple[int, int], bytes]]:
    """The opening of leaf ``index`` (a ``LeafOpening`` or its dict) tied to ``root_hex`` in a tree of ``size``
    leaves: the leaf and every committed node its proof reveals. Raises :class:`Forfeit`."""
    got = opening if isinstance(opening, dict) else opening.model_dump()
    try:
        if got["index"] != index:
            raise Forfeit(f"asked for leaf {index}, it opened leaf {got['index']}")
        weights, rest, trace = (_hex64(got[k], k) for k in ("weights", "rest", "trace"))
        proof = [bytes.fromhex(_hex64(h, "a proof hash")) for h in got["proof"]]
    except (KeyError, TypeError) as exc:
        raise Forfeit(f"the opening of leaf {index} is malformed: {type(exc).__name__}") from None
    leaf = leaf_of(weights, rest, trace)
    nodes = path_nodes(bytes.fromhex(leaf), index, size, proof)
    if nodes is None or nodes[(0, size)] != bytes.fromhex(root_hex):
        raise Forfeit(f"leaf {index} as opened does not reach the committed root (its proof fails)")
    return OpenedLeaf(index, weights, rest, trace, leaf), nodes


def _hex64(value: Any, what: str) -> str:
    if not (isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)):
        raise Forfeit(f"{what} is not 64 lowercase hex digits")
    return value


def _split(size: int) -> int:
    return 1 << ((size - 1).bit_length() - 1)


@dataclass
class Bisection:
    """The descent from the root to the first leaf where two trees of ``size`` leaves differ (see the module
    docstring). ``node``: the leaf range known to differ; ``steps``: what each opening showed."""

    size: int
    node: tuple[int, int] = (0, 0)
    steps: list[dict[str, Any]] = field(default_factory=list)
    opened: dict[int, tuple[OpenedLeaf, OpenedLeaf]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.node == (0, 0):
            self.node = (0, self.size)

    @property
    def done(self) -> bool:
        return self.node[1] - self.node[0] == 1

    @property
    def first_differing(self) -> int:
        """j: the first leaf where the trees differ (once done)."""
        return self.node[0]

    def probe(self) -> int:
        """The leaf both sides open next: the last of the node's left half."""
        lo, hi = self.node
        return lo + _split(hi - lo) - 1

    def record(self, index: int, a: tuple[OpenedLeaf, dict], b: tuple[OpenedLeaf, dict]) -> None:
        """Both sides' checked openings of ``index``: descend to the half that differs."""
        self.opened[index] = (a[0], b[0])
        if self.done or index != self.probe():
            return
        lo, hi = self.node
        split = lo + _split(hi - lo)
        equal_left = a[1][(lo, split)] == b[1][(lo, split)]
        self.node = (split, hi) if equal_left else (lo, split)
        self.steps.append({"node": [lo, hi], "opened": index, "left_half": [lo, split], "left_equal": equal_left})

    def needed(self) -> list[int]:
        """Once done: the leaves still to open, j and (for j > 0) the agreed j − 1."""
        j = self.first_differing
        return [i for i in ([j - 1, j] if j > 0 else [j]) if i not in self.opened]


@dataclass(frozen=True)
class Dispute:
    """What the replay must settle at the first differing leaf ``leaf``."""

    leaf: int
    compared: Compared
    segment: int | None
    """The segment replayed (None for S_0, which the broker builds)."""
    opened_state: int | None
    """The state the replay starts from, opened in full from one side (None for S_0)."""

    def as_dict(self) -> dict[str, Any]:
        return {"leaf": self.leaf, "compared": self.compared, "replayed_segment": self.segment,
                "from_state": self.opened_state}


def dispute(j: int, a: OpenedLeaf, b: OpenedLeaf) -> Dispute:
    """Where the replay starts and what it compares, given both sides' leaf j (see the module docstring)."""
    if a.state != b.state:
        if j == 0:
            return Dispute(0, "initial", None, None)
        return Dispute(j, "state", j - 1, j - 1)
    return Dispute(j, "trace", j, j)


def side_digest(compared: Compared, leaf: OpenedLeaf) -> dict[str, str]:
    """What of a side's leaf j the replay is compared with."""
    return {"trace": leaf.trace} if compared == "trace" else {"weights": leaf.weights, "rest": leaf.rest}


Finding = Literal["upheld", "refuted"]


def judge(compared: Compared, replayed: dict[str, str], sides: dict[str, OpenedLeaf]) -> dict[str, Finding]:
    """Each side upheld when its digest is the replay's, bit for bit, else refuted."""
    return {who: "upheld" if side_digest(compared, leaf) == {k: replayed[k] for k in side_digest(compared, leaf)}
            else "refuted" for who, leaf in sides.items()}
