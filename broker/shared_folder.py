"""A folder every host mounts (NFS, a shared volume) as an ObjectStore: the shared storage when
`TRAINMASTER_SHARED_STORAGE` is an absolute path (broker/shared_storage.py).

An object appears whole or not at all: it is written to a temporary sibling and renamed. Folders and files take
the root's owner and group permissions (files without the execute bits), not this process's private umask, and the
root's group, so the team the root is shared with (its group) can read what one of them put there; other users
never can, whatever the root's mode (a job's outputs and bundles are the team's, not the machine's). Keys never
leave the root.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

from trainmaster.backends.base import LocalEnvironmentError, Progress
from trainmaster.backends.managed.store import ObjectStore, StoredObject

CHUNK = 4 * 2**20
FILE_BITS = 0o660
"""A file's permissions: the root's, for its owner and group only, never execute."""
FOLDER_BITS = 0o770
"""A folder's permissions: the root's, for its owner and group only."""


class FolderStore(ObjectStore):
    scheme = "file"

    def __init__(self, root: Path):
        self.root = Path(root)

    def uri(self, key: str = "") -> str:
        return str(self.root / key) if key else str(self.root)

    def _path(self, key: str) -> Path:
        path = self.root / key
        if ".." in Path(key).parts or Path(key).is_absolute():
            raise LocalEnvironmentError(f"{key!r} is not a key inside {self.root}")
        return path

    async def size(self, key: str) -> int | None:
        return await asyncio.to_thread(self._size, self._path(key))

    @staticmethod
    def _size(path: Path) -> int | None:
        return path.stat().st_size if path.is_file() else None

    async def upload(self, path: Path, key: str, progress: Progress | None = None) -> None:
        await asyncio.to_thread(self._put, Path(path), self._path(key), progress)

    def _put(self, source: Path, target: Path, progress: Progress | None) -> None:
        mode = self._root_mode()
        self._folders(target.parent, mode)
        temporary = target.with_name(f".{target.name}.{secrets.token_hex(4)}.partial")
        total, done = source.stat().st_size, 0
        try:
            with open(source, "rb") as reader, open(temporary, "wb") as writer:
                while chunk := reader.read(CHUNK):
                    writer.write(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done, total)
                writer.flush()
                os.fsync(writer.fileno())
            temporary.chmod(mode & FILE_BITS)
            self._group(temporary)
            os.replace(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)
        if progress and not total:
            progress(0, 0)

    def _root_mode(self) -> int:
        if not self.root.is_dir():
            raise LocalEnvironmentError(f"the shared storage {self.root} is not a folder on this host (is it mounted?)")
        return self.root.stat().st_mode & FOLDER_BITS

    def _group(self, path: Path) -> None:
        """Give `path` the root's group (a setgid root does it already; a group we are not in is left as it is)."""
        gid = self.root.stat().st_gid
        if path.stat().st_gid != gid:
            try:
                os.chown(path, -1, gid)
            except PermissionError:
                pass

    def _folders(self, folder: Path, mode: int) -> None:
        """`folder` and the missing ones above it, each given the root's permissions."""
        missing = [p for p in (folder, *folder.parents) if p != self.root and self.root in p.parents and not p.is_dir()]
        for path in reversed(missing):
            path.mkdir(exist_ok=True)
            path.chmod(mode)
            self._group(path)

    async def read(self, key: str, offset: int = 0, limit: int | None = None) -> bytes | None:
        return await asyncio.to_thread(self._read, self._path(key), offset, limit)

    @staticmethod
    def _read(path: Path, offset: int, limit: int | None) -> bytes | None:
        if not path.is_file():
            return None
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read() if limit is None else f.read(limit)

    async def stream(self, key: str, offset: int = 0) -> AsyncIterator[bytes]:
        path = self._path(key)
        handle = await asyncio.to_thread(open, path, "rb")
        try:
            await asyncio.to_thread(handle.seek, offset)
            while chunk := await asyncio.to_thread(handle.read, CHUNK):
                yield chunk
        finally:
            await asyncio.to_thread(handle.close)

    async def list(self, prefix: str) -> list[StoredObject]:
        return await asyncio.to_thread(self._list, prefix)

    def _list(self, prefix: str) -> list[StoredObject]:
        found, start = [], self._path(prefix.rpartition("/")[0])  # the deepest folder the prefix names
        for path in sorted(start.rglob("*")) if start.is_dir() else []:
            key = path.relative_to(self.root).as_posix()
            if path.is_file() and key.startswith(prefix) and not path.name.endswith(".partial"):
                found.append(StoredObject(key=key, size=path.stat().st_size))
        return found

    async def copy(self, source: str, target: str) -> None:
        await asyncio.to_thread(self._put, self._path(source), self._path(target), None)

