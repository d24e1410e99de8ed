"""A folder that behaves like an object-store FUSE mount (Cloud Storage FUSE on Vertex AI, Azure ML's read-write
mounted output), for the runners: what reaches the store, and when.

The container writes into a local folder; an inotify watch (Linux, through ctypes) turns what happens there into
what such a mount does to the bucket:

* a file is uploaded when it is closed after writing (IN_CLOSE_WRITE), whole: a file held open and appended to
  reaches the store only when it is closed;
* a file renamed is deleted under its old name and uploaded under its new one (gcsfuse copies then deletes);
* a file removed is deleted;
* a directory renamed is refused by gcsfuse on a flat bucket (unless the mount allows it): here the rename has
  happened on the local disk, so it is recorded as a violation (clouds/checked.py), which fails the test, and
  its files are not uploaded under the new name.

Folders made later are watched as they appear (and the files already in them uploaded: a write that closed
before the watch was set). `settle()` waits until every event so far was applied: the runner calls it once the
container ended, before it reports the job's end.
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from clouds import checked

IN_CLOSE_WRITE, IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x8, 0x40, 0x80, 0x100, 0x200
IN_ISDIR, IN_Q_OVERFLOW, IN_IGNORED = 0x40000000, 0x4000, 0x8000
MASK = IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
EVENT = struct.Struct("iIII")
_libc = ctypes.CDLL(None, use_errno=True)


class ObjectMount:
    def __init__(self, root: Path, upload: Callable[[str, Path], None], delete: Callable[[str], None], *,
                 service: str, rename_dirs: bool = False):
        self.root, self.upload, self.delete = root, upload, delete
        self.service, self.rename_dirs = service, rename_dirs
        self.fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.watches: dict[int, Path] = {}
        self.uploads = 0
        self.refused: list[str] = []
        self.busy = False
        self._stop = threading.Event()
        self._watch_tree(root, upload_existing=False)
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"{service}-mount")
        self._thread.start()

    def _watch_tree(self, folder: Path, *, upload_existing: bool) -> None:
        for current, dirs, files in os.walk(folder):
            wd = _libc.inotify_add_watch(self.fd, os.fsencode(current), MASK)
            if wd >= 0:
                self.watches[wd] = Path(current)
            if upload_existing:
                for name in files:
                    self._upload(Path(current) / name)

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def _upload(self, path: Path) -> None:
        if path.is_file() and not path.is_symlink():
            self.upload(self._rel(path), path)
            self.uploads += 1

    def _run(self) -> None:
        cookies: dict[int, Path] = {}
        while not self._stop.is_set():
            ready, _, _ = select.select([self.fd], [], [], 0.05)
            if not ready:
                continue
            self.busy = True
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                self.busy = False
                continue
            offset = 0
            while offset < len(data):
                wd, mask, cookie, size = EVENT.unpack_from(data, offset)
                name = data[offset + EVENT.size: offset + EVENT.size + size].rstrip(b"\0").decode()
                offset += EVENT.size + size
                folder = self.watches.get(wd)
                if mask & IN_IGNORED:
                    self.watches.pop(wd, None)
                    continue
                if folder is None or not name:
                    continue
                path = folder / name
                try:
                    self._apply(mask, path, cookie, cookies)
                except FileNotFoundError:  # gone again meanwhile: its own event follows
                    pass
            self.busy = False

    def _apply(self, mask: int, path: Path, cookie: int, cookies: dict[int, Path]) -> None:
        if mask & IN_ISDIR:
            if mask & IN_CREATE:
                self._watch_tree(path, upload_existing=True)
            elif mask & IN_MOVED_FROM and not self.rename_dirs:
                problem = (f"directory {self._rel(path)} renamed on the mount: Cloud Storage FUSE refuses to rename "
                           "a directory of a flat bucket")
                self.refused.append(problem)
                checked.record(self.service, "mount", [problem])
            return
        if mask & IN_CLOSE_WRITE:
            self._upload(path)
        elif mask & IN_MOVED_FROM:
            cookies[cookie] = path
            self.delete(self._rel(path))
        elif mask & IN_MOVED_TO:
            cookies.pop(cookie, None)
            self._upload(path)
        elif mask & IN_DELETE:
            self.delete(self._rel(path))

    def settle(self, timeout_s: float = 30) -> None:
        """Wait until every event so far has been applied (nothing queued, nothing being applied, twice in a row)."""
        import fcntl
        import termios

        deadline, quiet = time.monotonic() + timeout_s, 0
        pending = ctypes.c_int()
        while quiet < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
            fcntl.ioctl(self.fd, termios.FIONREAD, pending)
            quiet = quiet + 1 if pending.value == 0 and not self.busy else 0

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        os.close(self.fd)
