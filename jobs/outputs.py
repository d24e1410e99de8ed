"""Which of a run's output files are kept: the job spec's `outputs:` rule.

`select` is the rule itself, a pure function of the fetched files' paths and sizes: a file is kept
when it matches one of the `include` patterns (none given: every file) and none of the `exclude`
patterns, and the kept files together may not be over `max_gb`. Patterns use the
`.trainmasterignore` syntax (jobs/ignore.py): a pattern without a `/` matches a name at any depth
(`training_args.bin` also matches `checkpoint-500/training_args.bin`), one with a `/` the whole
relative path, `**` crosses folders, and a trailing `/` names a folder and everything under it.

The broker fetches every file, applies the rule, deletes the dropped files with `remove` and records
only what is kept, so an excluded file is neither stored nor judged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from trainmaster.jobs.ignore import IgnoreRules

BYTES_PER_GB = 10**9


class OutputsRule(Protocol):
    """What `select` reads of the spec's `outputs:` section (jobs.spec.Outputs)."""

    include: list[str]
    exclude: list[str]
    max_gb: float | None


@dataclass(frozen=True)
class Selection:
    """``kept`` and ``dropped`` are relative POSIX paths; ``too_big`` says why the kept files are refused."""

    kept: tuple[str, ...]
    dropped: tuple[str, ...]
    kept_bytes: int
    too_big: str | None = None


def select(files: Iterable[tuple[str, int]], rule: OutputsRule) -> Selection:
    """Split ``(relative path, size)`` pairs into kept and dropped by ``rule``."""
    include = IgnoreRules.parse("\n".join(rule.include)) if rule.include else None
    exclude = IgnoreRules.parse("\n".join(rule.exclude))
    kept, dropped, kept_bytes = [], [], 0
    for path, size in files:
        if (include is None or matches(include, path)) and not matches(exclude, path):
            kept.append(path)
            kept_bytes += size
        else:
            dropped.append(path)
    too_big = None
    if rule.max_gb is not None and kept_bytes > rule.max_gb * BYTES_PER_GB:
        too_big = (f"the outputs are {kept_bytes / BYTES_PER_GB:.3f} GB, over the spec's outputs.max_gb of {rule.max_gb:g}; "
                   "raise it, or leave files out with outputs.exclude")
    return Selection(tuple(kept), tuple(dropped), kept_bytes, too_big)


def matches(rules: IgnoreRules, path: str) -> bool:
    """Whether the file ``path`` or one of the folders it is in matches ``rules``."""
    parts = path.split("/")
    return any(rules.ignored("/".join(parts[:i]), is_dir=True) for i in range(1, len(parts))) or rules.ignored(path, is_dir=False)


def remove(root: Path, paths: Iterable[str]) -> None:
    """Delete the dropped files under ``root``, and the folders that leaves empty (idempotent)."""
    for relative in paths:
        path = root / relative
        path.unlink(missing_ok=True)
        for parent in path.parents:
            if parent == root or not parent.is_relative_to(root):
                break
            try:
                parent.rmdir()
            except OSError:
                break  # not empty (or already gone)
