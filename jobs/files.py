"""File helpers written once: a file's sha256 read in chunks, and writes that a crash cannot tear.

An atomic write goes to a fresh temporary sibling (same directory, so the rename stays on one
filesystem), is fsynced, replaces the target with ``os.replace``, and then the directory is fsynced
so the rename itself survives a power cut. A reader sees the old file or the new one, never part of
either; a crash before the rename leaves the old file and at most a ``.<name>.<random>.tmp`` sibling.
The temporary name is unique per call, so two writers of one path never write into the same file.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

READ_CHUNK = 8 * 1024 * 1024


def sha256_file(path: Path | str) -> str:
    """Lowercase hex sha256 of a file, read in chunks (memory stays at one chunk whatever the size)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_dir(path: Path | str) -> None:
    """fsync a directory, making the renames and creations inside it durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(path: Path | str, data: bytes) -> None:
    """Replace ``path`` with ``data``: temporary sibling, fsync, ``os.replace``, fsync of the directory.

    The new file is its owner's alone (0o600, whatever the umask). On any error the temporary file
    is removed, the old file is untouched, and the error propagates.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: Path | str, obj: Any) -> None:
    """Write ``obj`` as JSON (sorted keys, indent 2, a final newline, UTF-8) with :func:`write_bytes_atomic`."""
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"))
