"""Bundles in the shared storage, content-addressed (`bundles/<sha256>.tar`): put there once built, and fetched
from there into this host's cache (`paths.bundles_dir()`) when a step needs one the cache lacks (the dispatch, the
replay audit), its sha256 checked before it is used. Unset storage: the local cache alone, as before.
"""

from __future__ import annotations

from pathlib import Path

from trainmaster.backends import transfer
from trainmaster.backends.base import ExecutorFault, Progress
from trainmaster.broker import paths
from trainmaster.broker.filekeeping import shared_storage
from trainmaster.broker.filekeeping.shared_storage import SharedStorageError


def key(sha256: str) -> str:
    return f"bundles/{sha256}.tar"


def local(sha256: str) -> Path:
    return paths.bundles_dir() / f"{sha256}.tar"


async def publish(sha256: str, progress: Progress | None = None) -> None:
    """Put the built bundle in the shared storage (skipped when it already holds that bundle)."""
    store = shared_storage.store()
    if store is None:
        return
    await transfer.upload(local(sha256), stored_size=lambda: store.size(key(sha256)),
                          put=lambda path, shown: store.upload(path, key(sha256), shown), progress=progress)


async def fetched(sha256: str, progress: Progress | None = None) -> Path:
    """The bundle in this host's cache, fetched from the shared storage when the cache lacks it. A bundle there
    whose bytes do not hash to `sha256` is refused (SharedStorageError naming it) and never kept."""
    path = local(sha256)
    store = None if path.is_file() else shared_storage.store()
    if store is None:
        return path  # a bundle missing with no storage set is told by the step that opens it, as before
    where = store.uri(key(sha256))
    size = await store.size(key(sha256))
    if size is None:
        raise SharedStorageError(f"bundle {sha256} is neither in {path} nor at {where}")
    try:
        await transfer.download(lambda offset: store.stream(key(sha256), offset), path, size=size, sha256=sha256,
                                progress=progress)
    except ExecutorFault as exc:
        raise SharedStorageError(f"{where} is not the bundle it names, so it is not used: {exc}") from None
    return path
