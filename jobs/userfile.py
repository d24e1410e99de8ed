"""Bounded reads of the files a user (or a client of the daemon) names: specs, policies, triggers, the registry,
backends.yaml and the other YAML files trainmaster reads.

A name is not trusted to be a small regular file: `/dev/zero` never ends, a FIFO blocks its reader until a writer
comes (forever, when none does), a directory or a socket is no file at all. :func:`read_user_file` opens the path
without blocking (`O_NONBLOCK`: opening a FIFO with no writer returns at once), checks with `fstat` on that very
descriptor that it is a regular file no larger than the limit, and reads at most `limit + 1` bytes, so a file that
grows while it is read is refused too. Links are followed (a user's dotfiles are often links); what is checked is
what the link leads to. Whatever it refuses raises :class:`UnreadableFile` (an `OSError`), whose message names the
file and the reason and never holds its bytes.

`MAX_USER_FILE_BYTES` is the one cap for these files: real ones are a few kilobytes.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from trainmaster.jobs.files import kind_of

MAX_USER_FILE_BYTES = 1024 * 1024
"""The largest user file read (1 MiB): a spec, a policy, triggers.yaml, backends.yaml, the registry."""

OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class UnreadableFile(OSError):
    """A user file refused before its bytes are used: not a regular file, or over the size cap."""

    def __init__(self, path: Path | str, reason: str):
        super().__init__(errno.EINVAL, reason, str(path))
        self.path, self.reason = str(path), reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def read_user_file(path: Path | str, limit: int = MAX_USER_FILE_BYTES) -> bytes:
    """The bytes of the regular file at `path` (links followed), at most `limit` of them; `UnreadableFile` for a
    FIFO, a device, a socket, a directory or a larger file, `FileNotFoundError` (and the other `OSError`s) as the
    system says."""
    try:
        fd = os.open(path, OPEN_FLAGS)
    except IsADirectoryError:
        raise UnreadableFile(path, "is a directory, not a file") from None
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO opened for writing only
            raise UnreadableFile(path, "is not a regular file (a socket or a special file); it is not read") from None
        raise
    try:
        info = os.fstat(fd)
        if kind := kind_of(info.st_mode):
            raise UnreadableFile(path, f"is {kind}, not a regular file; it is not read")
        if info.st_size > limit:
            raise UnreadableFile(path, f"is {info.st_size} bytes, over the limit of {limit} bytes for this file")
        os.set_blocking(fd, True)  # a regular file: reads never wait on anyone
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise UnreadableFile(path, f"grew past the limit of {limit} bytes for this file while it was read")
    return data


def read_user_text(path: Path | str, limit: int = MAX_USER_FILE_BYTES) -> str:
    """:func:`read_user_file` decoded as UTF-8 (`UnicodeDecodeError` for other bytes)."""
    return read_user_file(path, limit).decode("utf-8")


def is_regular_file(path: Path | str) -> bool:
    """Whether `path` names a regular file (links followed), looked at without opening it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False
