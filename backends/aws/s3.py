"""The managed backend's object store on S3: a bucket and a key prefix (`aws.s3_bucket`, `aws.s3_prefix`).

Uploads go through boto3's managed transfer (multipart above `aws.multipart_mb`, parts in parallel) with its
byte callback as the progress; reads are ranged GETs; copies are server-side (`copy_object`, and the managed
copy, in parts, for an object over 5 GB).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

from trainmaster.backends.aws import sdk
from trainmaster.backends.aws.config import AwsConfig
from trainmaster.backends.base import BackendError, ConfigurationError, Progress
from trainmaster.backends.managed.store import ObjectStore, StoredObject

CHUNK = 4 * 2**20
COPY_IN_ONE = 5 * 2**30
"""copy_object's limit: a larger object is copied in parts."""
MISSING = {"NoSuchKey", "404", "NotFound"}


class S3Store(ObjectStore):
    scheme = "s3"

    def __init__(self, config: AwsConfig):
        if not config.s3_bucket:
            raise ConfigurationError("aws.s3_bucket is not set in backends.yaml: the bucket where bundles and outputs "
                                     "are staged")
        self.config, self.bucket = config, config.s3_bucket
        self.prefix = config.s3_prefix.strip("/") + "/" if config.s3_prefix.strip("/") else ""

    @property
    def client(self):
        return sdk.client(self.config, "s3")

    def uri(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{self.prefix}{key}"

    def _where(self, key: str) -> str:
        return f"S3 {self.uri(key)}"

    async def size(self, key: str) -> int | None:
        try:
            head = await sdk.call(f"head {self._where(key)}", self.client.head_object, Bucket=self.bucket,
                                  Key=self.prefix + key)
        except BackendError as exc:
            if _missing(exc):
                return None
            raise
        return int(head["ContentLength"])

    async def upload(self, path: Path, key: str, progress: Progress | None = None) -> None:
        from boto3.s3.transfer import TransferConfig

        part = self.config.multipart_mb * 2**20
        total = (await asyncio.to_thread(path.stat)).st_size
        sent, lock = [0], threading.Lock()

        def moved(count: int) -> None:  # boto3 calls it from its worker threads, with the bytes each part moved
            with lock:
                sent[0] += count
                done = sent[0]
            if progress:
                progress(done, total)

        await sdk.call(f"upload {path} to {self._where(key)}", self.client.upload_file, str(path), self.bucket,
                       self.prefix + key, Callback=moved,
                       Config=TransferConfig(multipart_threshold=part, multipart_chunksize=part, use_threads=True))

    async def read(self, key: str, offset: int = 0, limit: int | None = None) -> bytes | None:
        size = await self.size(key)
        if size is None:
            return None
        end = size if limit is None else min(size, offset + limit)
        if offset >= end:
            return b""
        return await self._range(key, offset, end - 1)

    async def _range(self, key: str, first: int, last: int) -> bytes | None:
        """Bytes `first`..`last` (inclusive) of the object; None when it is gone."""
        try:
            got = await sdk.call(f"read {self._where(key)}", self.client.get_object, Bucket=self.bucket,
                                 Key=self.prefix + key, Range=f"bytes={first}-{last}")
        except BackendError as exc:
            if _missing(exc):
                return None
            raise
        return await sdk.call(f"read {self._where(key)}", got["Body"].read)

    async def stream(self, key: str, offset: int = 0) -> AsyncIterator[bytes]:
        """One GET from `offset` to the end, its body read CHUNK bytes at a time (a GET per chunk would pay a
        round trip each); a stream that breaks off is resumed by the caller from the bytes it has."""
        what = f"read {self._where(key)}"
        if offset and offset >= (await self.size(key) or 0):
            return  # nothing after `offset` (S3 answers such a range with 416)
        got = await sdk.call(what, self.client.get_object, Bucket=self.bucket, Key=self.prefix + key,
                             **({"Range": f"bytes={offset}-"} if offset else {}))
        body = got["Body"]
        try:
            while chunk := await sdk.call(what, body.read, CHUNK):
                yield chunk
        finally:
            body.close()

    async def list(self, prefix: str) -> list[StoredObject]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix + prefix)
        found = await sdk.call(f"list {self._where(prefix)}", lambda: [o for page in pages for o in page.get("Contents", [])])
        return [StoredObject(key=o["Key"][len(self.prefix):], size=int(o["Size"])) for o in found]

    async def copy(self, source: str, target: str) -> None:
        what = f"copy {self._where(source)} to {self._where(target)}"
        size = await self.size(source)
        if size is None:
            raise BackendError(f"{what}: the source does not exist")
        origin = {"Bucket": self.bucket, "Key": self.prefix + source}
        if size <= COPY_IN_ONE:
            await sdk.call(what, self.client.copy_object, Bucket=self.bucket, Key=self.prefix + target, CopySource=origin)
        else:
            await sdk.call(what, self.client.copy, origin, self.bucket, self.prefix + target)


def _missing(exc: BackendError) -> bool:
    return sdk.error_code(exc.__cause__)[0] in MISSING if exc.__cause__ is not None else False
