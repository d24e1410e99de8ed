"""An object store as the managed backends use it: a bucket (or container) and a key prefix in it.

Each cloud implements it over its SDK (`backends/aws/s3.py`, `backends/gcp/gcs.py`, `backends/azure/blob.py`).
Keys are relative to the store's root (its bucket and prefix); `uri` names one the way its service does.
Every method is a coroutine that keeps the SDK's blocking calls off the event loop. An implementation
raises the core's typed errors: throttling, 5xx and dropped connections as `TransientBackendError`, missing
credentials or permissions as `BackendError` naming what is missing.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

from trainmaster.backends.base import Frozen, Progress


class StoredObject(Frozen):
    key: str
    size: int


class ObjectStore(abc.ABC):
    scheme: ClassVar[str]
    """How `uri` starts: `s3`, `gs`, or `https` for Azure (the blob URL, the form Azure ML takes as a job's input)."""

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
