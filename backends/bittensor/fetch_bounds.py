"""What a miner's outputs may cost the broker in disk and in time, checked before and while they are fetched.

Before a byte is written: the sizes the miner announces (its output manifest) must fit the spec's
`outputs.max_gb` (more is the miner's statement: ExecutorFault, rejected and banned) and this disk's free space,
keeping RESERVE_BYTES for the state database (less is our environment: LocalEnvironmentError, the attempt waits
with what to fix, nothing is written and nothing is blamed).

While fetching: the whole fetch has a deadline from its announced size at the config's floor rate
(`download_floor_kb_s`) plus `download_grace_s`, counted from the first try (kept beside the destination, so a
process that dies and a later one that resumes share one deadline). A miner that has not delivered by then —
trickling its bytes, or cutting every answer short — is the miner's doing: ExecutorFault.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from trainmaster.backends.base import ExecutorFault, LocalEnvironmentError

RESERVE_BYTES = 256 * 2**20
"""Kept free beyond the outputs: the state database and the verdicts must still be written."""
STARTED = ".fetch-started"


@dataclass(frozen=True)
class Bounds:
    max_bytes: int | None
    """The spec's outputs.max_gb in bytes (None: no limit of the spec)."""
    floor_bytes_per_s: int
    grace_s: float


def check_announced(who: str, sizes: list[int], bounds: Bounds, dest: Path, have: int = 0) -> None:
    """The announced `sizes` against the spec's limit and the free disk under `dest` (`have`: bytes of them
    already on disk from an earlier try)."""
    total = sum(sizes)
    if any(s < 0 for s in sizes):
        raise ExecutorFault(f"{who} announced an output of negative size")
    if bounds.max_bytes is not None and total > bounds.max_bytes:
        raise ExecutorFault(f"{who} announced {_size(total)} of outputs, over the spec's outputs.max_gb "
                            f"({_size(bounds.max_bytes)}); nothing of them was fetched")
    where = _existing(dest)
    free = shutil.disk_usage(where).free
    need = max(0, total - have)
    if need + RESERVE_BYTES > free:
        raise LocalEnvironmentError(
            f"the outputs {who} announced take {_size(total)}, and {where} has {_size(free)} free (keeping "
            f"{_size(RESERVE_BYTES)} for the state database): free some space, or set the job's outputs.max_gb "
            "to refuse outputs this large; nothing was fetched")


def deadline(dest: Path, total: int, bounds: Bounds, now: float | None = None) -> float:
    """When the fetch into `dest` must be done: its first try's time (recorded now when there is none) plus the
    grace and the time `total` bytes take at the floor rate."""
    now = time.time() if now is None else now
    marker = dest.with_name(f".{dest.name}{STARTED}")
    try:
        started = float(marker.read_text())
    except (OSError, ValueError):
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(repr(now))
        started = now
    return started + bounds.grace_s + total / bounds.floor_bytes_per_s


def done(dest: Path) -> None:
    """The fetch finished (or was given up): its first-try record goes."""
    dest.with_name(f".{dest.name}{STARTED}").unlink(missing_ok=True)


def too_slow(who: str, got: int, total: int, bounds: Bounds) -> ExecutorFault:
    return ExecutorFault(
        f"{who} delivered {got:,} of the {total:,} bytes of outputs it announced within the "
        f"{bounds.grace_s:g} s + {bounds.floor_bytes_per_s // 1000:,} kB/s the broker allows (bittensor."
        "download_floor_kb_s, download_grace_s): too slow, or cut short every time")


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _size(n: int) -> str:
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,} bytes"


def partial_bytes(folder: Path) -> int:
    """Bytes already on disk under a fetch's temporary folder (earlier tries' partial files)."""
    total = 0
    if folder.is_dir():
        for root, _, names in os.walk(folder):
            for name in names:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except OSError:
                    pass
    return total
