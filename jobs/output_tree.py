"""A returned outputs folder, walked bounded, before any file in it is opened.

Used twice: by the fetch (backends/transfer.py), which copies what it finds, and by the safety check
(verify/pipeline.py), which refuses, by relative path and kind and without opening them: a symbolic
link (it could point anywhere), a FIFO (opening it waits forever for a writer), a socket, a device;
a folder nested deeper than :data:`MAX_DEPTH` (a 1,200-deep tree used to crash the recursive walk,
which read as "cannot verify"), a path longer than :data:`MAX_PATH_BYTES`, and more than
:data:`MAX_ENTRIES` entries in all (each file is classified by its first bytes: a million empty
files would take minutes). Every such entry is listed, not only the first; the executor made them,
so they are reasons to reject the attempt.

An entry's type comes from the directory listing (no stat per file: a checkpoint directory holds
thousands); only entries the listing cannot call a file, a folder or a link are ``lstat``-ed.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .files import kind_of

MAX_DEPTH = 64
"""Folders inside the outputs folder: a checkpoint segment sits 3 deep, a Hugging Face run's files 4."""
MAX_PATH_BYTES = 1024
"""A relative path's length: beyond it, the absolute path can pass the kernel's PATH_MAX (4,096)."""
MAX_ENTRIES = 100_000
"""Files and folders in all: a run of 10,000 checkpoint segments leaves about 50,000; each file is
opened and its first bytes read, so this bounds the safety check to seconds."""

FILE, FOLDER, LINK, SPECIAL = "file", "folder", "link", "special"


@dataclass(frozen=True)
class Entry:
    """One entry: ``kind`` is FILE, FOLDER, LINK or SPECIAL; ``refused`` says why it is refused (None
    for a file or folder within the bounds). A refused folder is not walked into."""

    relative: str
    """Its path under the walked folder, POSIX style."""
    entry: os.DirEntry
    kind: str
    refused: str | None = None


@dataclass
class OutputTree:
    """The regular files of an outputs folder (depth first in name order) and what was refused in it."""

    files: list[Entry] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def walk(root: Path) -> OutputTree:
    """The regular files under ``root`` within the bounds, and every refusal."""
    tree = OutputTree()
    for item in entries(root):
        if item.refused:
            tree.refused.append(item.refused)
        elif item.kind == FILE:
            tree.files.append(item)
    return tree


def entries(root: Path) -> Iterator[Entry]:
    """Every entry under ``root`` (links never followed), depth first in name order, up to the first
    entry past :data:`MAX_ENTRIES` (yielded, refused, and the walk stops there)."""
    stack: list[Iterator[tuple[str, os.DirEntry]]] = [iter(_listing(Path(root), ""))]
    for seen in itertools.count(1):
        while stack and (item := next(stack[-1], None)) is None:
            stack.pop()
        if not stack:
            return
        found = _entry(*item, depth=len(stack))
        if seen > MAX_ENTRIES:
            yield Entry(found.relative, found.entry, found.kind,
                        f"the outputs hold more than {MAX_ENTRIES:,} files and folders; the rest is not looked at")
            return
        if found.kind == FOLDER and not found.refused:
            try:
                stack.append(iter(_listing(Path(found.entry.path), found.relative + "/")))
            except OSError as exc:  # a folder the executor made unreadable is its doing
                found = Entry(found.relative, found.entry, FOLDER, f"{found.relative} cannot be listed ({exc.strerror})")
        yield found


def _entry(relative: str, entry: os.DirEntry, *, depth: int) -> Entry:
    if entry.is_symlink():
        return Entry(relative, entry, LINK, f"{relative} is a symbolic link")
    kind = FILE if entry.is_file(follow_symlinks=False) else FOLDER if entry.is_dir(follow_symlinks=False) else SPECIAL
    if len(relative.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        return Entry(relative, entry, kind, f"{relative[:80]}… is a path longer than {MAX_PATH_BYTES} bytes")
    if kind == SPECIAL:
        return Entry(relative, entry, kind, f"{relative} is {_special_kind(entry)}; it is not opened")
    if kind == FOLDER and depth > MAX_DEPTH:
        return Entry(relative, entry, kind, f"{relative} nests folders deeper than {MAX_DEPTH} levels; "
                                            "what is below is not looked at")
    return Entry(relative, entry, kind)


def _listing(folder: Path, prefix: str) -> list[tuple[str, os.DirEntry]]:
    """A folder's entries in name order (at most MAX_ENTRIES + 1 of a folder of millions)."""
    with os.scandir(folder) as listing:
        found = sorted(itertools.islice(listing, MAX_ENTRIES + 1), key=lambda entry: entry.name)
    return [(prefix + entry.name, entry) for entry in found]


def _special_kind(entry: os.DirEntry) -> str:
    try:
        return kind_of(entry.stat(follow_symlinks=False).st_mode) or "not a regular file"
    except OSError:
        return "an entry that cannot be looked at"
