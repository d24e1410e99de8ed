"""What trainmaster gives back to the disk under the retention policy (retention.py), by kind:

- `segments`: in a job accepted on trusted compute, the segments its trusted attempts wrote, except, in
  the accepted attempt, the last one (S_n: the state to continue training from) and those the replay
  audit opened (S_i and S_i+1 for each challenged i), the evidence of its verdict. Half-written
  segment directories left by a kill go too. The commitment, outputs, logs and verdicts are kept.
- `environments`: cached job virtualenvs (`envs/`): unfinished or failed builds, and the least recently
  used beyond `envs_max_gb`. One that a running job uses (its lock held, backends/local/venvs.py) is
  kept and counted first.

`reclaimable` says what would go (`trainmaster gc --dry-run`), `remove` removes it; the broker applies
the policy to a job as it is accepted (`job_segments`, then `give_back`).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from trainmaster.backends.base import Offer
from trainmaster.backends.local import venvs
from trainmaster.broker import paths
from trainmaster.broker.retention import Retention
from trainmaster.broker.store import Attempt, Store

KINDS = ("segments", "environments")
SEGMENTS = "segments"  # the local backend's checkpoint layout: <checkpoint dir>/segments/<i as 8 digits>/


@dataclass(frozen=True)
class Reclaimable:
    """Paths of one kind that can go together (one attempt's segments, one environment), their size and why."""

    kind: str
    where: Path
    paths: tuple[Path, ...]
    bytes: int
    why: str

    def to_json(self) -> dict:
        return {"kind": self.kind, "where": str(self.where), "count": len(self.paths), "bytes": self.bytes,
                "why": self.why}


def envs_dir() -> Path:
    """Where the local backend caches job environments: backends.yaml's `local.envs_dir`, else `envs/` in the home."""
    from trainmaster.backends.config import load_configs

    configured = load_configs(paths.config_dir())["local"].envs_dir
    return Path(configured) if configured else paths.home() / "envs"


def reclaimable(store: Store, retention: Retention, envs: Path) -> list[Reclaimable]:
    """Everything the retention policy lets go now, over every accepted job and the environment cache."""
    found = []
    if retention.drop_accepted_segments:
        for job in store.jobs(states_in={"accepted"}, limit=-1):
            found += job_segments(store, job.id)
    return found + environments(envs, retention.envs_max_bytes)


def give_back(segments: list[Reclaimable], envs_max_bytes: int) -> list[Reclaimable]:
    """Once a job is accepted (in a worker thread: it walks the environments): remove its `segments` and the
    environments over the cap; returns what was removed."""
    return remove(segments + environments(envs_dir(), envs_max_bytes))


def job_segments(store: Store, job_id: str) -> list[Reclaimable]:
    """The segments of an accepted job's trusted attempts that no resume or audit needs any more."""
    attempts = store.attempts(job_id)
    accepted = [a for a in attempts if a.state == "accepted" and _trusted(a)]
    if not accepted:
        return []
    keep = _kept_segments(store, job_id, accepted[-1])
    found = []
    for attempt in attempts:
        if attempt.state not in ("accepted", "failed", "cancelled") or not _trusted(attempt):
            continue
        base = paths.attempt_dir(job_id, attempt.n) / "checkpoints" / SEGMENTS
        kept = keep if attempt.id == accepted[-1].id else set()
        dropped = tuple(p for p in _children(base) if not (p.name.isdigit() and int(p.name) in kept))
        if dropped:
            why = ("accepted: every segment but the last and the audited ones" if kept
                   else f"an earlier {attempt.state} attempt of an accepted job")
            found.append(Reclaimable("segments", base, dropped, sum(map(size_of, dropped)), why))
    return found


def _kept_segments(store: Store, job_id: str, attempt: Attempt) -> set[int]:
    """The last segment of the accepted attempt, and S_i, S_i+1 of each segment i its replay audit challenged."""
    from trainmaster.verify.records import VerdictStore

    base = paths.attempt_dir(job_id, attempt.n) / "checkpoints" / SEGMENTS
    complete = [int(p.name) for p in _children(base) if p.name.isdigit()]
    verdicts = VerdictStore(store.path)
    try:
        verdict = verdicts.latest(job_id, attempt.id)
    finally:
        verdicts.close()
    replay = (verdict.evidence.get("replay") or {}) if verdict else {}
    challenged = [i for i in (replay.get("challenge") or {}).get("segments", []) if isinstance(i, int)]
    return set(complete[-1:] if complete else []) | {j for i in challenged for j in (i, i + 1)}


def environments(envs: Path, max_bytes: int) -> list[Reclaimable]:
    """Unfinished builds, then the least recently used environments beyond `max_bytes`; those in use are kept."""
    found, ready = [], []
    for venv in (p for p in _children(envs) if p.is_dir() and not p.name.startswith(".")):
        if _in_use(venv):
            max_bytes -= size_of(venv)
        elif not (venv / venvs.READY).exists():
            found.append(Reclaimable("environments", venv, (venv,), size_of(venv), "an unfinished or failed build"))
        else:
            ready.append((_mtime(venv / venvs.READY), venv, size_of(venv)))
    total = 0
    for last_use, venv, size in sorted(ready, reverse=True):  # newest use first
        total += size
        if total > max_bytes:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(last_use))
            found.append(Reclaimable("environments", venv, (venv,), size,
                                     f"least recently used (last {when}), beyond the environments' cap"))
    return found


def remove(items: list[Reclaimable]) -> list[Reclaimable]:
    """Remove what `items` name; returns those removed (an environment taken into use meanwhile is left)."""
    done = []
    for item in items:
        if item.kind == "environments":
            if venvs.remove_unused(item.where):
                done.append(item)
            continue
        for path in item.paths:
            shutil.rmtree(path, ignore_errors=True)
        done.append(item)
    return done


def by_kind(items: list[Reclaimable]) -> dict[str, int]:
    return {kind: sum(i.bytes for i in items if i.kind == kind) for kind in KINDS}


def size_of(path: Path) -> int:
    """Bytes of the files under `path` (links not followed)."""
    if not path.is_dir() or path.is_symlink():
        return path.lstat().st_size if path.exists() or path.is_symlink() else 0
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def _in_use(venv: Path) -> bool:
    """Whether a job runs with `venv` or it is being built: its lock is held (probed, then released)."""
    with open(venvs.lock_path(venv), "a") as lock:
        if not venvs.try_lock(lock, fcntl.LOCK_EX):
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
