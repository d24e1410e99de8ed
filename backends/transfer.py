"""Moving an attempt's files into the broker: the one helper every backend uses.

Whatever the source (a local folder, an HTTP stream, a cloud bucket), each file is hashed as it
arrives, a partial download resumes from the bytes already on disk, a file whose size or sha256
differs from what was announced is refused, and a folder appears whole or not at all (built in a
temporary sibling, then renamed). Progress is reported through a callback so the CLI can draw a
bar without backends knowing about terminals.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import hashlib
import os
import shutil
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import nullcontext
from pathlib import Path

from trainmaster.backends.base import (
    ExecutorFault, LocalEnvironmentError, OutputFile, Progress, TransientBackendError,
)
from trainmaster.jobs.output_tree import FILE, FOLDER, SPECIAL, Entry, entries

CHUNK = 4 * 2**20
PARTIAL = ".partial"
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


async def copy_tree(source: Path, dest: Path, progress: Progress | None = None, *, link: bool = True) -> list[OutputFile]:
    """Copy the files under `source` to `dest` atomically, hashing each; links are skipped (outputs
    are plain files; a link could point anywhere). The walk is bounded (jobs/output_tree.py): what it
    refuses is mirrored, never opened, so that the safety check refuses it by name: every folder is
    made (a too-deep tree stays too deep), and a FIFO or socket is made again as an empty one of its
    kind (a device, which only root can make, as a FIFO). Idempotent: an existing `dest` is listed,
    not copied again.

    With `link` (the default), a file is hard-linked instead of copied where `source` and `dest` are
    on one filesystem, so outputs are stored once however large; each is still read through once to
    hash it. A hard link shares the file's inode, so a process still writing to `source` would change
    the stored output after it was hashed: link only a folder nothing writes to any more (the local
    backend fetches after the run's whole process group has ended), and pass `link=False` otherwise.
    """
    return await asyncio.to_thread(_copy_tree, source, dest, progress, link)


def _copy_tree(source: Path, dest: Path, progress: Progress | None, link: bool = True) -> list[OutputFile]:
    if dest.exists():
        return list_files(dest)
    tmp = dest.with_name(f".{dest.name}{PARTIAL}")
    shutil.rmtree(tmp, ignore_errors=True)
    found = list(entries(source)) if source.is_dir() else []
    files = [(Path(item.entry.path), item.entry.stat(follow_symlinks=False).st_size) for item in found if item.kind == FILE]
    total, done = sum(size for _, size in files), 0
    try:
        tmp.mkdir(parents=True)
        _mirror_refusable(found, tmp)
        link = link and files != [] and os.stat(source).st_dev == os.stat(tmp).st_dev
        out = []
        for path, _ in files:
            rel = path.relative_to(source)
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            digest, size = hashlib.sha256(), 0
            linked = link and _hard_link(path, target)
            with open(target if linked else path, "rb") as src, nullcontext() if linked else open(target, "wb") as sink:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    if sink:
                        sink.write(chunk)
                    size += len(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done, total)
                if sink:
                    sink.flush()
                os.fsync((sink or src).fileno())  # a linked file's data may still be only in the page cache
            _owner_only(target)
            out.append(OutputFile(path=rel.as_posix(), size=size, sha256=digest.hexdigest()))
        os.replace(tmp, dest)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _disk_error(exc, dest, total) from None
    return out


def _owner_only(path: Path) -> None:
    """Drop group and other permissions from a stored output (a job may have made it 0644 or 0666 itself)."""
    mode = os.stat(path).st_mode & 0o777
    if mode & 0o077:
        os.chmod(path, mode & 0o700)


def _hard_link(path: Path, target: Path) -> bool:
    """Hard-link `target` to `path`; False where the filesystem refuses (then the file is copied)."""
    try:
        os.link(path, target, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EACCES):
            return False
        raise
    return True


def _mirror_refusable(found: list[Entry], tmp: Path) -> None:
    """Make every folder of ``found`` under ``tmp``, and an empty stand-in for each special file."""
    for item in found:
        target = tmp / item.relative
        if item.kind == FOLDER:
            target.mkdir(parents=True, exist_ok=True)
        elif item.kind == SPECIAL:
            mode = stat.S_IFMT(item.entry.stat(follow_symlinks=False).st_mode)
            os.mknod(target, (mode if mode in (stat.S_IFIFO, stat.S_IFSOCK) else stat.S_IFIFO) | 0o600)


def _plain_files(root: Path) -> list[tuple[Path, int]]:
    if not root.is_dir():
        return []
    return [(Path(item.entry.path), item.entry.stat(follow_symlinks=False).st_size)
            for item in entries(root) if item.kind == FILE]


def list_files(root: Path) -> list[OutputFile]:
    """Every plain file under `root` with its size and sha256 (for a folder fetched earlier)."""
    from trainmaster.jobs.files import sha256_file

    return [OutputFile(path=p.relative_to(root).as_posix(), size=size, sha256=sha256_file(p))
            for p, size in _plain_files(root)]


async def upload(
    path: Path,
    *,
    stored_size: Callable[[], Awaitable[int | None]],
    put: Callable[[Path, Progress | None], Awaitable[None]],
    progress: Progress | None = None,
) -> bool:
    """Send one file to a content-addressed place (its key holds its sha256): skipped when the place already
    holds as many bytes (the same content), else `put(path, progress)`, which reports (bytes done, bytes in all)
    as parts complete, like `download`. Returns whether it was sent."""
    size = (await asyncio.to_thread(os.stat, path)).st_size
    if await stored_size() == size:
        if progress:
            progress(size, size)
        return False
    await put(path, progress)
    return True


async def download(
    read: Callable[[int], AsyncIterator[bytes]],
    dest: Path,
    *,
    size: int,
    sha256: str,
    progress: Progress | None = None,
) -> OutputFile:
    """Stream one file into `dest`: `read(offset)` yields its bytes from `offset` on.

    Bytes already in `dest`'s partial file are kept and the stream resumes after them (their hash
    is recomputed, not trusted). More bytes than announced, or a different sha256 at the end, and
    the partial file is deleted and the transfer refused: the sender is at fault, not the network.
    A disk that fills deletes the partial file too (LocalEnvironmentError: our side, nothing kept).
    """
    if dest.is_file() and dest.stat().st_size == size and await asyncio.to_thread(_sha256, dest) == sha256:
        return OutputFile(path=dest.name, size=size, sha256=sha256)
    part = dest.with_name(dest.name + PARTIAL)
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest, have = await asyncio.to_thread(_resume_state, part, size)
    sink = _Sink(part, digest)
    try:
        await sink.open()
        async for chunk in read(have):
            have += len(chunk)
            if have > size:
                raise ExecutorFault(f"{dest.name}: the sender sent more than the {size} bytes it announced")
            await sink.add(chunk)
            if progress:
                progress(have, size)
        await sink.finish()
    except OSError as exc:
        if exc.errno in DISK_FULL:
            part.unlink(missing_ok=True)  # a full disk keeps nothing: what is freed lets the state database write
        raise _disk_error(exc, dest, size) from None
    finally:
        await sink.close()
    if have < size:
        raise TransientBackendError(f"{dest.name}: the transfer stopped at {have} of {size} bytes; it resumes on retry")
    if digest.hexdigest() != sha256:
        part.unlink(missing_ok=True)
        raise ExecutorFault(f"{dest.name}: sha256 {digest.hexdigest()} differs from the announced {sha256}")
    os.replace(part, dest)
    return OutputFile(path=dest.name, size=size, sha256=sha256)


class _Sink:
    """A partial download's file, appended to and hashed on two worker threads at once (both release the
    GIL), one batch (CHUNK bytes) at a time while the next batch arrives: the event loop never waits on the
    disk, the fsync or the hash, and at most two batches are held in memory."""

    def __init__(self, path: Path, digest):
        self.path, self.digest = path, digest
        self.file = None
        self.batch: list[bytes] = []
        self.batched = 0
        self.flight: list[concurrent.futures.Future] = []

    async def open(self) -> None:
        self.file = await asyncio.to_thread(open, self.path, "ab")

    async def add(self, chunk: bytes) -> None:
        self.batch.append(chunk)
        self.batched += len(chunk)
        if self.batched >= CHUNK:
            await self._landed()
            self.flight = [_HASHER.submit(self._hash, self.batch), _WRITER.submit(self.file.writelines, self.batch)]
            self.batch, self.batched = [], 0

    async def finish(self) -> None:
        """The last batch hashed and written, and the file flushed to disk."""
        await self._landed()
        await asyncio.to_thread(self._last, self.batch)
        self.batch, self.batched = [], 0

    async def close(self) -> None:
        """Close the file once nothing is in flight (also when the download failed or was cancelled)."""
        if self.flight:
            await asyncio.to_thread(concurrent.futures.wait, self.flight)
        if self.file is not None:
            await asyncio.to_thread(self.file.close)

    async def _landed(self) -> None:
        """Wait for the batch in flight; an OSError of its write is raised here."""
        for future in self.flight:
            await asyncio.wrap_future(future)
        self.flight = []

    def _hash(self, batch: list[bytes]) -> None:
        for chunk in batch:
            self.digest.update(chunk)

    def _last(self, batch: list[bytes]) -> None:
        self._hash(batch)
        self.file.writelines(batch)
        self.file.flush()
        os.fsync(self.file.fileno())


_HASHER = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="transfer-hash")
_WRITER = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="transfer-write")
"""The threads downloads hash and write on (one batch of each download in flight on each)."""


def _resume_state(part: Path, size: int):
    digest, have = hashlib.sha256(), 0
    if part.is_file():
        if part.stat().st_size > size:
            part.unlink()
        else:
            with open(part, "rb") as f:
                while chunk := f.read(CHUNK):
                    digest.update(chunk)
                    have += len(chunk)
    return digest, have


def _sha256(path: Path) -> str:
    from trainmaster.jobs.files import sha256_file

    return sha256_file(path)


def _disk_error(exc: OSError, dest: Path, need: int) -> LocalEnvironmentError:
    """Writing on our side failed: our environment's fault, never the sender's."""
    if exc.errno in DISK_FULL:
        return LocalEnvironmentError(
            f"no space left while writing to {dest.parent} (needs {need / 1e6:.1f} MB); "
            "free some space and run `trainmaster status` to fetch again"
        )
    return LocalEnvironmentError(f"cannot write {dest}: {exc}")
