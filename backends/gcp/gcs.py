"""The managed backend's object store on Google Cloud Storage: `staging_bucket` (gs://bucket/prefix) as its root.

Large files go up as resumable uploads in `upload_chunk_mb` parts, the progress told as each part is taken;
reads are ranged downloads; copies stay on the server (rewrite). The SDK's blocking calls run off the loop and
its errors come back as the core's typed errors (gcp/sdk.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from trainmaster.backends.base import BackendError, Progress
from trainmaster.backends.gcp import sdk
from trainmaster.backends.gcp.config import GcpConfig
from trainmaster.backends.object_store import ObjectStore, StoredObject

STREAM_CHUNK = 8 * 2**20
CHUNK_UNIT = 256 * 2**10
"""Resumable upload parts are multiples of 256 KiB."""


def split_bucket(staging_bucket: str | None) -> tuple[str, str]:
    """("bucket", "prefix/") of a gs:// URI ("" for no prefix)."""
    if not staging_bucket:
        raise BackendError("gcp: no staging bucket (set gcp.staging_bucket: gs://bucket/prefix)")
    bucket, _, prefix = staging_bucket.removeprefix("gs://").partition("/")
    prefix = prefix.strip("/")
    return bucket, prefix + "/" if prefix else ""


class _Counted:
    """A file read by the SDK part by part: what was read before each read has been sent."""

    def __init__(self, handle, total: int, progress: Progress):
        self.handle, self.total, self.progress, self.done = handle, total, progress, 0

    def read(self, size: int = -1) -> bytes:
        self.progress(self.done, self.total)
        data = self.handle.read(size)
        self.done += len(data)
        return data

    def tell(self) -> int:
        return self.handle.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        found = self.handle.seek(offset, whence)
        self.done = found
        return found


class GcsStore(ObjectStore):
    scheme = "gs"

    def __init__(self, config: GcpConfig):
        self.config = config
        self.bucket_name, self.prefix = split_bucket(config.staging_bucket)
        self._bucket = None

    @classmethod
    def at(cls, config: GcpConfig, bucket: str, prefix: str) -> GcsStore:
        return cls(config.model_copy(update={"staging_bucket": f"gs://{bucket}/{prefix}"}))

    @property
    def bucket(self):
        if self._bucket is None:
            creds, found = sdk.credentials(self.config)
            client = sdk.storage().Client(project=sdk.project(self.config, found), credentials=creds)
            self._bucket = client.bucket(self.bucket_name)
        return self._bucket

    def uri(self, key: str = "") -> str:
        return f"gs://{self.bucket_name}/{self.prefix}{key}"

    async def size(self, key: str) -> int | None:
        blob = await sdk.call(f"reading {self.uri(key)}", lambda: self.bucket.get_blob(self.prefix + key))
        return None if blob is None else blob.size

    async def upload(self, path: Path, key: str, progress: Progress | None = None) -> None:
        await sdk.call(f"uploading {path} to {self.uri(key)}", self._upload, path, key, progress)

    def _upload(self, path: Path, key: str, progress: Progress | None) -> None:
        chunk = max(CHUNK_UNIT, self.config.upload_chunk_mb * 2**20 // CHUNK_UNIT * CHUNK_UNIT)
        blob = self.bucket.blob(self.prefix + key, chunk_size=chunk)
        total = path.stat().st_size
        with path.open("rb") as handle:
            source = _Counted(handle, total, progress) if progress else handle
            # no size: the SDK's resumable upload in chunk_size parts (it sends a file of 8 MiB or less in one
            # request when told its size)
            blob.upload_from_file(source, size=total if total <= blob.chunk_size else None,
                                  content_type="application/octet-stream")
        if progress:
            progress(total, total)

    async def read(self, key: str, offset: int = 0, limit: int | None = None) -> bytes | None:
        return await sdk.call(f"reading {self.uri(key)}", self._read, self.prefix + key, offset, limit)

    def _read(self, name: str, offset: int, limit: int | None) -> bytes | None:
        from google.api_core import exceptions as api

        if limit == 0:
            return b"" if self.bucket.get_blob(name) is not None else None
        end = None if limit is None else offset + limit - 1
        try:
            return self.bucket.blob(name).download_as_bytes(start=offset, end=end, checksum=None)
        except api.NotFound:
            return None
        except api.RequestRangeNotSatisfiable:  # at or past the end
            return b""

    async def stream(self, key: str, offset: int = 0) -> AsyncIterator[bytes]:
        while True:
            data = await self.read(key, offset, STREAM_CHUNK)
            if data is None:
                raise BackendError(f"gcp: {self.uri(key)} is gone")
            if data:
                yield data
                offset += len(data)
            if len(data) < STREAM_CHUNK:
                return

    async def list(self, prefix: str) -> list[StoredObject]:
        def listed() -> list[StoredObject]:
            blobs = self.bucket.client.list_blobs(self.bucket_name, prefix=self.prefix + prefix)
            return [StoredObject(key=b.name[len(self.prefix):], size=b.size) for b in blobs]

        return await sdk.call(f"listing {self.uri(prefix)}", listed)

    async def copy(self, source: str, target: str) -> None:
        def copied() -> None:
            bucket = self.bucket
            bucket.copy_blob(bucket.blob(self.prefix + source), bucket, self.prefix + target)

        await sdk.call(f"copying {self.uri(source)} to {self.uri(target)}", copied)
