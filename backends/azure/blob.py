"""The Blob container of an Azure storage account as the managed backend's object store (azure-storage-blob).

Keys live under the configured prefix of the container. Uploads go in blocks (`block_mb`, `concurrency` at
once) with a progress hook; reads are ranged; a copy is the service's own (`start_copy_from_url`, same
account). `uri` is the blob's URL, the form Azure ML takes as a job's input or output path.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

from trainmaster.backends.azure import sdk
from trainmaster.backends.azure.config import AzureConfig
from trainmaster.backends.base import BackendError, Progress
from trainmaster.backends.object_store import ObjectStore, StoredObject

CONNECTION_STRING = "AZURE_STORAGE_CONNECTION_STRING"
COPY_POLL_S = 0.2


class BlobStore(ObjectStore):
    scheme = "https"

    def __init__(self, config: AzureConfig):
        self.config = config
        self.prefix = config.prefix.strip("/") + "/" if config.prefix.strip("/") else ""
        self._container = None

    @classmethod
    def at(cls, config: AzureConfig, bucket: str, prefix: str) -> BlobStore:
        return cls(config.model_copy(update={"container": bucket, "prefix": prefix}))

    @property
    def container(self):
        if self._container is None:
            self._container = self._service().get_container_client(self.config.container)
        return self._container

    def _service(self):
        blob, size = sdk.blob(), self.config.block_mb * 2**20
        options = {"max_block_size": size, "max_single_put_size": size}
        if connection := os.environ.get(CONNECTION_STRING):
            return blob.BlobServiceClient.from_connection_string(connection, **options)
        url = self.config.storage_url or (self.config.storage_account
                                          and f"https://{self.config.storage_account}.blob.core.windows.net")
        if not url:
            raise BackendError(f"no storage account: set azure.storage_account (or azure.storage_url, or "
                               f"{CONNECTION_STRING})")
        return blob.BlobServiceClient(url, credential=sdk.credential(self.config.credential), **options)

    def uri(self, key: str = "") -> str:
        return f"{self.container.url}/{self.prefix}{key}"

    async def size(self, key: str) -> int | None:
        client = self.container.get_blob_client(self.prefix + key)
        try:
            return (await sdk.call(f"size of {key}", client.get_blob_properties)).size
        except BackendError as exc:
            if _missing(exc):
                return None
            raise

    async def upload(self, path: Path, key: str, progress: Progress | None = None) -> None:
        client = self.container.get_blob_client(self.prefix + key)

        def hook(done: int, total: int | None) -> None:
            if progress:
                progress(done, total)

        def send() -> None:
            with open(path, "rb") as f:
                client.upload_blob(f, overwrite=True, max_concurrency=self.config.concurrency, progress_hook=hook)

        try:
            await sdk.call(f"upload of {key}", send)
        except BackendError as exc:
            if getattr(exc.__cause__, "error_code", None) != "ContainerNotFound":
                raise
            await sdk.call(f"creating container {self.config.container}", self.container.create_container)
            await sdk.call(f"upload of {key}", send)

    async def read(self, key: str, offset: int = 0, limit: int | None = None) -> bytes | None:
        size = await self.size(key)
        if size is None:
            return None
        if offset >= size or limit == 0:
            return b""
        client = self.container.get_blob_client(self.prefix + key)
        length = None if limit is None else min(limit, size - offset)
        reader = await sdk.call(f"read of {key}", client.download_blob, offset=offset, length=length)
        return await sdk.call(f"read of {key}", reader.readall)

    async def stream(self, key: str, offset: int = 0) -> AsyncIterator[bytes]:
        client = self.container.get_blob_client(self.prefix + key)
        reader = await sdk.call(f"download of {key}", client.download_blob, offset=offset or None)
        chunks = reader.chunks()
        while (chunk := await sdk.call(f"download of {key}", next, chunks, None)) is not None:
            yield chunk

    async def list(self, prefix: str) -> list[StoredObject]:
        def listed() -> list[StoredObject]:
            found = self.container.list_blobs(name_starts_with=self.prefix + prefix)
            return [StoredObject(key=b.name[len(self.prefix):], size=b.size) for b in found]

        try:
            return await sdk.call(f"listing of {prefix}", listed)
        except BackendError as exc:
            if _missing(exc):
                return []
            raise

    async def root_exists(self) -> bool:
        """Whether the container is there (`list` answers nothing for a missing one: uploads create it)."""
        return await sdk.call(f"looking up container {self.config.container}", self.container.exists)

    async def copy(self, source: str, target: str) -> None:
        client = self.container.get_blob_client(self.prefix + target)
        source_url = self.container.get_blob_client(self.prefix + source).url
        copied = await sdk.call(f"copy of {source}", client.start_copy_from_url, source_url)
        status = copied["copy_status"]
        while status == "pending":
            await asyncio.sleep(COPY_POLL_S)
            status = (await sdk.call(f"copy of {source}", client.get_blob_properties)).copy.status
        if status != "success":
            raise BackendError(f"copy of {source} to {target} ended {status}")


def _missing(exc: BackendError) -> bool:
    """The error says the blob or its container does not exist."""
    return isinstance(exc.__cause__, sdk.errors().ResourceNotFoundError)
