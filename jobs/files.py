"""File helpers written once: a file's sha256 read in chunks, bounded reads of files a job wrote, and
writes that a crash cannot tear.

A file a job wrote (a commitment, a result, a manifest, a metrics log) is hostile until checked: it
could be a link to a secret, a FIFO that blocks its reader forever, a device, or a sparse file of
50 GB. :func:`read_regular` looks at it with ``lstat`` first, opens it without following a link and
without blocking (``O_NOFOLLOW | O_NONBLOCK``), requires a regular file (the same inode it looked at)
no larger than the caller's limit, and reads at most ``limit + 1`` bytes. What it refuses raises
:class:`HostileFile`, whose message names the file and the reason and never holds its bytes.

An atomic write goes to a fresh temporary sibling (same directory, so the rename stays on one
filesystem), is fsynced, replaces the target with ``os.replace``, and then the directory is fsynced
so the rename itself survives a power cut. A reader sees the old file or the new one, never part of
either; a crash before the rename leaves the old file and at most a ``.<name>.<random>.tmp`` sibling.
The temporary name is unique per call, so two writers of one path never write into the same file.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

READ_CHUNK = 8 * 1024 * 1024
NO_FOLLOW_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
"""Open a job's file without following a final link or waiting for a FIFO's writer."""
SPECIAL_KINDS = (
    (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"),
)


class HostileFile(Exception):
    """A file refused before its bytes are used: a link, not a regular file, or over its size limit.

    ``name`` is how the caller names the file (a relative path); ``reason`` never holds its content.
    """

    def __init__(self, name: str, reason: str):
        super().__init__(f"{name}: {reason}")
        self.name = name
        self.reason = reason


def kind_of(mode: int) -> str | None:
    """What a file of ``mode`` is, as a phrase, when it is anything but a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((phrase for test, phrase in SPECIAL_KINDS if test(mode)), "not a regular file")


def open_regular(path: Path | str, name: str | None = None) -> tuple[int, os.stat_result]:
    """An open descriptor on the regular file ``path`` and its ``fstat``; a link, FIFO, socket, device
    or directory raises :class:`HostileFile` without being opened (``lstat`` first), and one swapped
    in between the look and the open is refused by its inode."""
    name = name or Path(path).name
    looked = os.lstat(path)  # FileNotFoundError and the like propagate: a missing file is not hostile
    if kind := kind_of(looked.st_mode):
        raise HostileFile(name, f"is {kind}, not a regular file; it is not opened")
    try:
        fd = os.open(path, NO_FOLLOW_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EMLINK):
            raise HostileFile(name, "was replaced by a link or a special file while it was opened") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) != (looked.st_dev, looked.st_ino):
        os.close(fd)
        raise HostileFile(name, "was replaced while it was opened; it is not read")
    return fd, info


def read_regular(path: Path | str, limit: int, name: str | None = None) -> bytes:
    """The bytes of the regular file ``path``, refused (:class:`HostileFile`) when it is not one or is
    over ``limit`` bytes: the size is checked before reading, and at most ``limit + 1`` bytes are read
    (a file that grows while it is read is refused too)."""
    name = name or Path(path).name
    fd, info = open_regular(path, name)
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > limit:
            raise HostileFile(name, f"is {info.st_size} bytes, over the limit of {limit} bytes for this file")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise HostileFile(name, f"grew past the limit of {limit} bytes for this file while it was read")
    return data


def read_tail(path: Path | str, nbytes: int, name: str | None = None) -> tuple[bytes, int, os.stat_result]:
    """The last ``nbytes`` of the regular file ``path``, where they start, and its ``fstat``
    (:class:`HostileFile` as for :func:`read_regular`): a log's end, whatever its size."""
    fd, info = open_regular(path, name)
    with os.fdopen(fd, "rb") as handle:
        start = max(0, info.st_size - nbytes)
        handle.seek(start)
        return handle.read(nbytes), start, info


def sha256_file(path: Path | str) -> str:
    """Lowercase hex sha256 of a regular file, read in chunks (memory stays at one chunk whatever the
    size); a link or special file raises :class:`HostileFile` (a FIFO would block, a device never end)."""
    digest = hashlib.sha256()
    fd, _ = open_regular(path)
    with os.fdopen(fd, "rb") as handle:
        while chunk := handle.read(READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def tree_bytes(path: Path | str) -> int:
    """Bytes of the files under `path` (a file: its own size), links never followed and counted as themselves."""
    path = Path(path)
    try:
        info = path.lstat()
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(info.st_mode):
        return info.st_size
    total = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


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


def try_exclusive_lock(path: Path | str) -> int | None:
    """An open descriptor holding an exclusive `flock` on `path` (created 0600 when missing), or None when another
    process holds it; closing the descriptor, or the process ending however it ends, lets it go. Any other
    `OSError` (opening the file, a filesystem without locks) propagates."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:
        os.close(fd)
        raise
    return fd
