"""The synced folder on an object-store mount: what node 0's launcher copies there while the job runs, and how.

On SageMaker, Vertex AI and Azure ML the synced folder reaches the object store through the service: SageMaker's
checkpoint sync of /opt/ml/checkpoints, Vertex AI's Cloud Storage FUSE mount (gcsfuse), Azure ML's read-write
mounted output. The mounts upload a file when it is closed (a file held open and appended to stays invisible
until the end) and gcsfuse refuses to rename a directory on a flat bucket, which is how the runtime publishes
a checkpoint segment. So on those services the job writes its outputs and checkpoints into local folders of
node 0's scratch disk, and the launcher publishes them into the synced folder (`Publisher`), every
`INTERVAL_S` while the job runs and once more when it ended, only ever as closed files:

* a file is copied whole (opened, written, closed) when it is new or changed since it was last copied;
  files the job is still writing (dot-named temporaries of an atomic write: `.x.tmp`, a segment's
  `segments/.<i>.tmp/`) wait until they are renamed into place (locally) — except at the end, when every
  regular file is copied;
* a checkpoint segment (`checkpoints/segments/<8 digits>/`) is copied file by file, its `manifest.json` last,
  into the folder of its final name: a segment whose manifest is in the store is whole, and no directory is
  ever renamed on the mount;
* a file the job removed is removed from the synced folder (retention, a rewritten file set);
* what the job prints goes to `log/<16-digit byte offset>.log` parts (`LogParts`): the current part is
  rewritten whole as it grows and closed each time; a part is left as it is once it holds `PART_BYTES` or is
  `PART_S` old, and the next one starts at the offset where it ended. Read by offset, the parts are the
  job's log (backends/managed/backend.py).

Before the job starts, what the synced folder already holds (a service's restart restored it, or the broker
carried an earlier attempt's checkpoints and metrics there) is copied into the local folders, so the job
resumes from it as it would from the synced folder itself.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from pathlib import Path

INTERVAL_S = 1.0
PART_BYTES = 256 * 1024
PART_S = 30.0
LOG_FOLDER = "log"
SEGMENT = re.compile(r"\d{8}")
MANIFEST = "manifest.json"


def part_name(offset: int) -> str:
    return f"{offset:016d}.log"


def restore(sync: Path, local: Path, names: tuple[str, ...]) -> None:
    """Copy `names` (sub-folders) of the synced folder into the local folder, before the job starts."""
    for name in names:
        source = sync / name
        if source.is_dir():
            shutil.copytree(source, local / name, dirs_exist_ok=True, symlinks=False,
                            ignore=lambda folder, entries: [e for e in entries if e.startswith(".")])


class LogParts:
    """The job's log as closed part files under `folder`, each named by the byte offset it starts at."""

    def __init__(self, folder: Path, part_bytes: int = PART_BYTES, part_s: float = PART_S):
        self.folder, self.part_bytes, self.part_s = folder, part_bytes, part_s
        self.start, self.current, self.opened = 0, bytearray(), time.monotonic()
        self.pending = False
        self.lock = threading.Lock()
        existing = sorted(folder.glob("*.log")) if folder.is_dir() else []
        if existing:  # a restarted launcher (a service's restart) goes on after the log it left
            last = existing[-1]
            self.start = int(last.stem) + last.stat().st_size

    def write(self, data: bytes) -> None:
        with self.lock:
            self.current += data
            self.pending = True

    def flush(self) -> None:
        """Write the current part (closed), and start the next one when it is full or old."""
        with self.lock:
            if not self.pending:
                return
            data, start = bytes(self.current), self.start
            self.pending = False
            if len(data) >= self.part_bytes or time.monotonic() - self.opened >= self.part_s:
                self.start, self.current, self.opened = start + len(data), bytearray(), time.monotonic()
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / part_name(start), "wb") as handle:
            handle.write(data)


class Publisher:
    """Copies `local/<name>` into `sync/<name>` for each of `names` as closed files, and the log as parts."""

    def __init__(self, local: Path, sync: Path, names: tuple[str, ...], interval_s: float = INTERVAL_S):
        self.local, self.sync, self.names, self.interval_s = local, sync, names, interval_s
        self.log = LogParts(sync / LOG_FOLDER)
        self.copied: dict[str, tuple[int, int]] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainmaster-publisher", daemon=True)
        for name in names:  # what was restored is already there
            self._remember(name)

    def _remember(self, name: str) -> None:
        root = self.local / name
        for path in _files(root, settled=False):
            stat = path.stat()
            rel = path.relative_to(self.local).as_posix()
            if (self.sync / rel).is_file():
                self.copied[rel] = (stat.st_size, stat.st_mtime_ns)

    def start(self) -> Publisher:
        self._thread.start()
        return self

    def finish(self) -> None:
        """Stop the periodic copies and publish everything once more (the job has ended)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.publish(final=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.publish(final=False)
            except OSError as exc:  # a mount that failed for a moment: tried again on the next round
                self.errors.append(str(exc))

    def publish(self, *, final: bool) -> None:
        self.log.flush()
        for name in self.names:
            self._mirror(name, final=final)

    def _mirror(self, name: str, *, final: bool) -> None:
        root = self.local / name
        here: set[str] = set()
        manifests: list[Path] = []
        for path in _files(root, settled=not final):
            rel = path.relative_to(self.local).as_posix()
            here.add(rel)
            if path.name == MANIFEST and SEGMENT.fullmatch(path.parent.name):
                manifests.append(path)  # each segment's manifest after all of its files
                continue
            self._copy(path, rel)
        for path in manifests:
            self._copy(path, path.relative_to(self.local).as_posix())
        for rel in [r for r in self.copied if r.startswith(name + "/") and r not in here]:
            (self.sync / rel).unlink(missing_ok=True)
            del self.copied[rel]

    def _copy(self, path: Path, rel: str) -> None:
        try:
            stat = path.stat()
        except FileNotFoundError:  # removed while listed: the next round sees it gone
            return
        stamp = (stat.st_size, stat.st_mtime_ns)
        if self.copied.get(rel) == stamp:
            return
        target = self.sync / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(path, target)
        except FileNotFoundError:
            return
        self.copied[rel] = stamp


def _files(root: Path, *, settled: bool) -> list[Path]:
    """The regular files under `root`, sorted; `settled`: leaving out dot-named ones (still being written)."""
    found = []
    if not root.is_dir():
        return found
    for folder, dirs, names in os.walk(root):
        if settled:
            dirs[:] = [d for d in dirs if not d.startswith(".")]
        dirs.sort()
        for name in sorted(names):
            if settled and name.startswith("."):
                continue
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink():
                found.append(path)
    return found
