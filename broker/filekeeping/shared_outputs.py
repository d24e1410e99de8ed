"""An accepted job's kept outputs in the shared storage, and getting them back on any host.

`publish` puts each file the database recorded for the accepted attempt under `jobs/<job id>/outputs/`, then
`jobs/<job id>/manifest.json` (every file's path, size and sha256; written last, so its presence says the folder
is whole). The broker records where in a `shared` event (`SHARED_EVENT`), which `trainmaster status` shows and
`trainmaster outputs` reads. `download` copies them into a folder with each size and sha256 checked against the
database's record (never against the storage's own manifest, which whoever can write there could change); a job
with no such event is read from this host's `$TRAINMASTER_HOME`, whose layout is the same.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from trainmaster.backends import transfer
from trainmaster.backends.base import ExecutorFault, Progress
from trainmaster.backends.object_store import ObjectStore
from trainmaster.broker.job_view import SHARED_EVENT
from trainmaster.broker import paths
from trainmaster.broker.filekeeping import shared_storage
from trainmaster.broker.filekeeping.shared_storage import SharedStorageError

if TYPE_CHECKING:
    from trainmaster.broker.store import Store

Files = list[tuple[str, int, str]]
"""(path, size, sha256) of each kept output, as the store records them."""


def folder_key(job_id: str) -> str:
    return f"jobs/{job_id}/outputs/"


def manifest_key(job_id: str) -> str:
    return f"jobs/{job_id}/manifest.json"


def manifest(job_id: str, attempt_id: str, files: Files) -> bytes:
    listed = [{"path": p, "size": s, "sha256": h} for p, s, h in files]
    return json.dumps({"job": job_id, "attempt": attempt_id, "files": listed}, indent=2).encode()


async def publish(store: ObjectStore, root: str, job_id: str, attempt_id: str, outputs: Path, files: Files,
                  progress: Progress | None = None) -> dict:
    """Put the kept outputs (in the local folder `outputs`) and their manifest there; returns the `shared` event's
    detail. A manifest already there with the same content means an earlier call finished: nothing is sent again."""
    listing = manifest(job_id, attempt_id, files)
    if await store.read(manifest_key(job_id)) != listing:
        for path, _, _ in files:
            await store.upload(outputs / _relative(path), folder_key(job_id) + path, progress)
        with tempfile.TemporaryDirectory() as scratch:
            written = Path(scratch) / "manifest.json"
            written.write_bytes(listing)
            await store.upload(written, manifest_key(job_id))
    where = store.uri(folder_key(job_id))
    return {"storage": root, "outputs": where, "files": len(files), "bytes": sum(s for _, s, _ in files),
            "reason": f"outputs put in {where} ({len(files)} files)"}


def _relative(path: str) -> PurePosixPath:
    """A recorded output path, refused when it would leave the folder it is read from or written to."""
    relative = PurePosixPath(path)
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise SharedStorageError(f"{path!r} is not a path inside a job's outputs")
    return relative


def recorded(store: Store, job_id: str) -> dict | None:
    """The `shared` event's detail (where the job's outputs were put), None when they never were."""
    return next((e.detail for e in reversed(store.events(job_id)) if e.kind == SHARED_EVENT), None)


def restore_home(store: Store, job_id: str, attempt_id: str) -> None:
    """This host's copy of an accepted attempt's outputs, fetched (checked) from the shared storage when it lacks
    any of them: for what reads them there (the promotion's artifacts and result.json) on a host that did not
    run the job. Synchronous, for a worker thread."""
    files = store.outputs(attempt_id)
    folder = paths.job_dir(job_id) / "outputs"
    shared = recorded(store, job_id)
    if shared is None or all((folder / _relative(path)).is_file() for path, _, _ in files):
        return
    asyncio.run(download(source(shared)[0], job_id, files, folder))


def source(shared: dict | None) -> tuple[ObjectStore, str]:
    """The store the outputs are read from, and its name: the shared storage the `shared` event recorded, or
    this host's home."""
    if shared is not None:
        return shared_storage.store_at(shared["storage"]), shared["storage"]
    return shared_storage.store_at(str(paths.home())), str(paths.home())


async def download(store: ObjectStore, job_id: str, files: Files, dest: Path,
                   progress_for: Callable[[str], Progress | None] = lambda path: None) -> None:
    """Copy each recorded output into `dest`, checked against its recorded size and sha256; a file that differs
    is refused (SharedStorageError naming where it was read) and nothing of it is left in `dest`."""
    for path, size, sha256 in files:
        key = folder_key(job_id) + path
        where = store.uri(key)
        found = await store.size(key)
        if found is None:
            raise SharedStorageError(f"{path} is missing at {where}")
        if found != size:
            raise SharedStorageError(f"{where} holds {found} bytes, not the {size} recorded for {path}: not used")
        try:
            await transfer.download(lambda offset, key=key: store.stream(key, offset), dest / _relative(path),
                                    size=size, sha256=sha256, progress=progress_for(path))
        except ExecutorFault as exc:
            raise SharedStorageError(f"{where} is not the output that was accepted, so it is not used: {exc}") from None
