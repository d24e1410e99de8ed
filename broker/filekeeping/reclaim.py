"""What trainmaster gives back to the disk under the retention policy (retention.py), by kind:

- `segments`: in a job accepted on trusted compute, the segments its trusted attempts wrote, except, in
  the accepted attempt, the last one (S_n: the state to continue training from) and those the replay
  audit opened (S_i and S_i+1 for each challenged i, from its stored verdict), the evidence of its
  verdict. Half-written segments left by a kill go too. The commitment, outputs, logs and verdicts are
  kept. The broker decides only WHICH indices to keep: it asks each attempt's backend what it holds
  (`segments_held`) and to release the rest (`release_segments`, backends/features.py `ReleasesSegments`);
  it never opens a backend's scratch folder itself. A backend without that capability has nothing
  reclaimed.
- `environments`: cached job virtualenvs (`envs/`): unfinished or failed builds, and the least recently
  used beyond `envs_max_gb`. One that a running job uses (its lock held, backends/local/venv_cache.py) is
  kept and counted first.

`reclaimable` says what would go (`trainmaster gc --dry-run`), `remove` removes it; the broker applies
the policy to a job as it is accepted (`job_segments`, then `give_back`). Both take `backend_of`, which
gives an attempt's backend (`Broker.backend_of`), or None when this version has none by its name.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainmaster.backends.base import Backend, Handle, Offer
from trainmaster.backends.features import HeldSegment, ReleasesSegments
from trainmaster.backends.local import venv_cache
from trainmaster.backends.retry import retried
from trainmaster.broker.filekeeping.retention import Retention
from trainmaster.broker.store import Attempt, Job, Store
from trainmaster.jobs.files import tree_bytes

KINDS = ("segments", "environments")

BackendOf = Callable[[Job, Attempt], Backend | None]


@dataclass(frozen=True)
class Reclaimable:
    """What can go together (one attempt's segments, one environment), how many directories, their size and
    why. `where` is the attempt id for segments (its backend knows where they lie), the path of an environment."""

    kind: str
    where: str
    count: int
    bytes: int
    why: str
    path: Path | None = None  # an environment's directory
    backend: ReleasesSegments | None = dataclasses.field(default=None, compare=False, repr=False)
    handle: Handle | None = None  # the attempt's handle, for its backend
    keep: frozenset[int] = frozenset()  # segment indices its backend must keep

    def to_json(self) -> dict:
        return {"kind": self.kind, "where": self.where, "count": self.count, "bytes": self.bytes, "why": self.why}


async def reclaimable(store: Store, retention: Retention, envs: Path, backend_of: BackendOf) -> list[Reclaimable]:
    """Everything the retention policy lets go now, over every accepted job and the environment cache."""
    found = []
    if retention.drop_accepted_segments:
        for job in store.jobs(states_in={"accepted"}, limit=-1):
            found += await job_segments(store, job.id, backend_of)
    return found + await asyncio.to_thread(environments, envs, retention.envs_max_bytes)


async def give_back(segments: list[Reclaimable], envs: Path, envs_max_bytes: int) -> list[Reclaimable]:
    """Once a job is accepted: remove its `segments` and the environments in `envs` over the cap (walked in a
    worker thread); returns what was removed."""
    return await remove(segments + await asyncio.to_thread(environments, envs, envs_max_bytes))


async def job_segments(store: Store, job_id: str, backend_of: BackendOf) -> list[Reclaimable]:
    """The segments of an accepted job's trusted attempts that no resume or audit needs any more, as their
    backends report them."""
    attempts = store.attempts(job_id)
    accepted = [a for a in attempts if a.state == "accepted" and _trusted(a)]
    if not accepted:
        return []
    job = store.job(job_id)
    found = []
    for attempt in attempts:
        if attempt.state not in ("accepted", "failed", "cancelled") or not _trusted(attempt) or not attempt.handle_json:
            continue
        backend = backend_of(job, attempt)
        if not isinstance(backend, ReleasesSegments):
            continue  # a backend that cannot release segments has none reclaimed
        handle = Handle.model_validate_json(attempt.handle_json)
        held = await retried(backend.segments_held, handle)
        last = attempt.id == accepted[-1].id
        keep = _kept_segments(store, job_id, attempt, held) if last else frozenset()
        dropped = [s for s in held if s.index is None or s.index not in keep]
        if dropped:
            why = ("accepted: every segment but the last and the audited ones" if last
                   else f"an earlier {attempt.state} attempt of an accepted job")
            found.append(Reclaimable("segments", attempt.id, len(dropped), sum(s.bytes for s in dropped), why,
                                     backend=backend, handle=handle, keep=keep))
    return found


def _kept_segments(store: Store, job_id: str, attempt: Attempt, held: list[HeldSegment]) -> frozenset[int]:
    """The last complete segment the accepted attempt holds, and S_i, S_i+1 of each segment i its replay audit
    challenged (its stored verdict says which)."""
    from trainmaster.verify.records import VerdictStore

    complete = [s.index for s in held if s.index is not None]
    verdicts = VerdictStore(store.path)
    try:
        verdict = verdicts.latest(job_id, attempt.id)
    finally:
        verdicts.close()
    replay = (verdict.evidence.get("replay") or {}) if verdict else {}
    challenged = [i for i in (replay.get("challenge") or {}).get("segments", []) if isinstance(i, int)]
    return frozenset(([max(complete)] if complete else []) + [j for i in challenged for j in (i, i + 1)])


def environments(envs: Path, max_bytes: int) -> list[Reclaimable]:
    """Unfinished builds, then the least recently used environments beyond `max_bytes`; those in use are kept."""
    found, ready = [], []
    for venv in (p for p in _children(envs) if p.is_dir() and not p.name.startswith(".")):
        if _in_use(venv):
            max_bytes -= size_of(venv)
        elif not (venv / venv_cache.READY).exists():
            found.append(Reclaimable("environments", str(venv), 1, size_of(venv), "an unfinished or failed build",
                                     path=venv))
        else:
            ready.append((_mtime(venv / venv_cache.READY), venv, size_of(venv)))
    total = 0
    for last_use, venv, size in sorted(ready, reverse=True):  # newest use first
        total += size
        if total > max_bytes:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(last_use))
            found.append(Reclaimable("environments", str(venv), 1, size,
                                     f"least recently used (last {when}), beyond the environments' cap", path=venv))
    return found


async def remove(items: list[Reclaimable]) -> list[Reclaimable]:
    """Remove what `items` name; returns those removed, segments with the bytes their backend freed (an
    environment taken into use meanwhile is left)."""
    done = []
    for item in items:
        if item.kind == "environments":
            if await asyncio.to_thread(venv_cache.remove_unused, item.path):
                done.append(item)
            continue
        freed = await retried(item.backend.release_segments, item.handle, set(item.keep))
        done.append(dataclasses.replace(item, bytes=freed))
    return done


def by_kind(items: list[Reclaimable]) -> dict[str, int]:
    return {kind: sum(i.bytes for i in items if i.kind == kind) for kind in KINDS}


def size_of(path: Path) -> int:
    """Bytes of the files under `path` (links not followed)."""
    return tree_bytes(path)


def _in_use(venv: Path) -> bool:
    """Whether a job runs with `venv` or it is being built: its lock is held (probed, then released)."""
    with open(venv_cache.lock_path(venv), "a") as lock:
        if not venv_cache.try_lock(lock, fcntl.LOCK_EX):
            return True
        fcntl.flock(lock, fcntl.LOCK_UN)
    return False


def _trusted(attempt: Attempt) -> bool:
    return Offer.model_validate_json(attempt.offer_json).trusted


def _children(directory: Path) -> list[Path]:
    return sorted(directory.iterdir()) if directory.is_dir() else []


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0
