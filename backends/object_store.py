"""The one object-store interface.

An object store is a bucket (or container) and a key prefix in it; keys are relative to that root. Each cloud
implements it over its SDK (`backends/aws/s3.py`, `backends/gcp/gcs.py`, `backends/azure/blob.py`) and a folder
every host mounts implements it over the filesystem (`backends/folder_store.py`). The managed backends stage
bundles and outputs in their cloud's store; the broker's shared storage and the triggers that count new objects
name a store by URI and get it here. Every method is a coroutine that keeps blocking calls off the event loop. An
implementation raises the core's typed errors: throttling, 5xx and dropped connections as `TransientBackendError`,
missing credentials or permissions as `BackendError` naming what is missing.

A store is named by a URI (an absolute folder, `s3://`, `gs://` or `az://bucket/prefix`) through the one resolver,
`backends.registry.store_for`: which cloud serves a scheme is the registry's word, so nothing above the backends
names a cloud, and each SDK is imported only when its store is made (`ObjectStore.at`).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

from trainmaster.backends.base import BackendConfig, Frozen, Progress


class StoredObject(Frozen):
    key: str
    size: int


class ObjectStore(abc.ABC):
    scheme: ClassVar[str]
    """How `uri` starts: `s3`, `gs`, or `https` for Azure (the blob URL, the form Azure ML takes as a job's input)."""

    @classmethod
    def at(cls, config: BackendConfig, bucket: str, prefix: str) -> ObjectStore:
        """The store over `bucket` (or container) and `prefix` (empty, or ending in "/"), with its cloud's settings
        (`config`: the cloud's section of backends.yaml: credentials, region, endpoint). A store a URI cannot name
        (a folder) has none."""
        raise NotImplementedError(f"{cls.__name__} is not named by a URI")

    @abc.abstractmethod
    def uri(self, key: str = "") -> str:
        """`key` as its service names it (`s3://bucket/prefix/key`)."""

    @abc.abstractmethod
    async def size(self, key: str) -> int | None:
        """The object's size, None when there is none."""

    @abc.abstractmethod
    async def upload(self, path: Path, key: str, progress: Progress | None = None) -> None:
        """Store the file at `key`, in parts (multipart, resumable or blocks) for large files, calling
        `progress(bytes done, bytes in all)` as parts complete."""

    @abc.abstractmethod
    async def read(self, key: str, offset: int = 0, limit: int | None = None) -> bytes | None:
        """At most `limit` bytes of the object from `offset` on (b"" at or past its end); None when there is none."""

    @abc.abstractmethod
    def stream(self, key: str, offset: int = 0) -> AsyncIterator[bytes]:
        """The object's bytes from `offset` on, in chunks (for `transfer.download`)."""

    @abc.abstractmethod
    async def list(self, prefix: str) -> list[StoredObject]:
        """Every object whose key starts with `prefix` (recursively), keys relative to the root."""

    async def root_exists(self) -> bool:
        """Whether the bucket or container is there. A store whose `list` of a missing one answers nothing (rather
        than raising) says so here; the others are there whenever their `list` answered."""
        return True

    @abc.abstractmethod
    async def copy(self, source: str, target: str) -> None:
        """Copy one object inside the store, on the server's side."""

