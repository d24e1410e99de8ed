"""The broker side of the remote harness: a Backend that speaks only the protocol of protocol.py, over
HTTP, to an executor process (server.py). It is handed no path of the executor's and hands it none of
the broker's: the bundle goes as a request body, outputs and openings come back as byte streams with
their size and sha256 announced first (`backends.transfer.download` checks both), and a checkpoint is
an opaque reference passed back as it is.

`RemoteExecutor` is untrusted (registered as `bittensor`: audited by replay, paid in rao only when
accepted); `TrustedRemoteExecutor` is the same client registered as a trusted backend (its attempts
resume from each other's checkpoints, which the broker allows only from trusted or accepted states).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypeVar

import aiohttp
from pydantic import BaseModel, ValidationError

from remote_executor import protocol
from trainmaster.backends.base import (
    AttemptContext, AttemptStatus, Backend, BackendError, Cost, ExecutorFault, Handle, LogChunk, Offer, OfferRequest,
    OfferSet, OutputFile, Progress, TransientBackendError,
)
from trainmaster.backends.features import (
    Acknowledgement, CheckpointRef, Conclusion, ExecutorIdentity, MetricsChunk, ReportsMetrics,
    ResumesFromCheckpoints, RunsUntrusted, SignedCommitment,
)
from trainmaster.backends import transfer
from trainmaster.jobs.spec import JobSpec

T = TypeVar("T", bound=BaseModel)
TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=60)
CHUNK = 1 << 16


class RemoteClient:
    """JSON calls and byte streams to one executor; its failures as the broker's typed errors."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    async def call(self, method: str, path: str, *, json_body=None, params=None, data=None) -> dict:
        try:
            async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
                async with session.request(method, self.url + path, json=json_body, params=params, data=data) as r:
                    text = await r.text(errors="replace")
                    _raise_for(r.status, text, path)
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
            raise TransientBackendError(f"the executor at {self.url} is unreachable: {exc!r}") from None
        try:
            got = json.loads(text)
        except (ValueError, RecursionError):
            raise ExecutorFault(f"{path}: the executor's answer is not JSON") from None
        if not isinstance(got, dict):
            raise ExecutorFault(f"{path}: the executor's answer is not a JSON object")
        return got

    async def answer(self, model: type[T], method: str, path: str, **kwargs) -> T:
        """A call whose answer is `model`; an answer that is not one is the executor's fault."""
        got = await self.call(method, path, **kwargs)
        try:
            return model.model_validate(got)
        except ValidationError as exc:
            raise ExecutorFault(f"{path}: not a valid {model.__name__} of the protocol ({exc.error_count()} errors)") from None

    def reader(self, path: str):
        """`read(offset)` for `transfer.download`: the bytes of `path` from `offset` on."""
        async def read(offset: int) -> AsyncIterator[bytes]:
            try:
                async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
                    async with session.get(self.url + path, params={"offset": offset}) as r:
                        if r.status != 200:
                            _raise_for(r.status, await r.text(), path)
                        async for chunk in r.content.iter_chunked(CHUNK):
                            yield chunk
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError):
                return  # a stream cut short: `download` reports the bytes missing, and resumes on a retry

        return read


def _raise_for(status: int, text: str, path: str) -> None:
    if status < 400:
        return
    try:
        reason = str(json.loads(text).get("error", ""))[:500]
    except (ValueError, AttributeError):
        reason = f"HTTP {status}"
    if status >= 500:
        raise TransientBackendError(f"the executor failed on {path}: {reason}")
    raise BackendError(f"the executor refused {path}: {reason}")


class RemoteBackend(ResumesFromCheckpoints, ReportsMetrics, Backend):
    """The protocol's calls every executor answers, reached at $TRAINMASTER_TEST_EXECUTOR_URL."""

    def __init__(self, config=None, url: str | None = None):
        super().__init__(None)
        self.client = RemoteClient(url or os.environ[protocol.URL_ENV])

    def _path(self, template: str, handle: Handle, **values: str) -> str:
        return protocol.route(template, attempt_id=handle.data["attempt_id"], **values)

    async def offers(self, request: OfferRequest) -> OfferSet:
        found = await self.client.answer(OfferSet, "POST", protocol.OFFERS,
                                         json_body={"request": request.model_dump(mode="json")})
        offers = [o.model_copy(update={"backend": self.name}) for o in found.offers]
        return OfferSet(backend=self.name, offers=offers, reasons=found.reasons)

    async def submit(self, bundle: Path, spec: JobSpec, offer: Offer, ctx: AttemptContext) -> Handle:
        await self._upload(bundle, ctx.bundle_sha256)
        context = ctx.model_copy(update={"workdir": "."})  # the broker's folders are no business of the executor
        got = await self.client.answer(protocol.Submitted, "POST", protocol.ATTEMPTS, json_body={
            "spec": spec.model_dump(mode="json"), "offer": offer.model_dump(mode="json"),
            "context": context.model_dump(mode="json")})
        return Handle(backend=self.name, attempt_id=ctx.attempt_id,
                      data={"attempt_id": got.attempt_id, "hotkey": got.hotkey})

    async def _upload(self, bundle: Path, sha256: str) -> None:
        async def body():
            with open(bundle, "rb") as f:
                while chunk := await asyncio.to_thread(f.read, CHUNK):
                    yield chunk

        await self.client.call("PUT", protocol.route(protocol.BUNDLE, sha256=sha256), data=body())

    async def status(self, handle: Handle) -> AttemptStatus:
        return await self.client.answer(AttemptStatus, "GET", self._path(protocol.STATUS, handle))

    async def logs(self, handle: Handle, offset: int = 0) -> LogChunk:
        return await self.client.answer(LogChunk, "GET", self._path(protocol.LOGS, handle), params={"offset": offset})

    async def metrics(self, handle: Handle, offset: int = 0, limit: int = 2**16) -> MetricsChunk:
        got = await self.client.answer(protocol.Metrics, "GET", self._path(protocol.METRICS, handle),
                                       params={"offset": offset, "limit": limit})
        try:
            data = protocol.decode(got.data)
        except ValueError:
            raise ExecutorFault("metrics: the chunk's data is not base64") from None
        return MetricsChunk(data=data[:limit], offset=got.offset, size=got.size, modified_at=got.modified_at)

    async def last_checkpoint(self, handle: Handle) -> CheckpointRef | None:
        got = await self.client.answer(protocol.Checkpoint, "GET", self._path(protocol.CHECKPOINT, handle))
        return None if got.uri is None else CheckpointRef(uri=got.uri)

    async def cancel(self, handle: Handle) -> int:
        return (await self.client.answer(protocol.Cancelled, "POST", self._path(protocol.CANCEL, handle))).stopped

    async def fetch(self, handle: Handle, dest: Path, progress: Progress | None = None) -> list[OutputFile]:
        """Each output streamed into a sibling folder, checked against its announced size and sha256, and
        the folder renamed to `dest` once all arrived (all or nothing); an existing `dest` is listed."""
        if dest.exists():
            return transfer.list_files(dest)
        files = await self._manifest(self._path(protocol.OUTPUTS, handle))
        tmp = dest.with_name(f".{dest.name}{transfer.PARTIAL}")
        for f in files:
            await transfer.download(self.client.reader(self._path(protocol.OUTPUT_FILE, handle, path=f.path)),
                                    tmp / f.path, size=f.size, sha256=f.sha256, progress=progress)
        tmp.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)
        return files

    async def _manifest(self, path: str, json_body=None) -> list[OutputFile]:
        """The files an answer announces, each a relative path below the folder it names (else the
        executor is at fault: a path that would land outside `dest`)."""
        files = (await self.client.answer(protocol.Files, "POST" if json_body is not None else "GET", path,
                                          json_body=json_body)).files
        for f in files:
            if not protocol.safe_relative(f.path):
                raise ExecutorFault(f"{path}: a file name is not a relative path below its folder")
        return files

    async def cost(self, handle: Handle, offer: Offer) -> Cost:
        return await self.client.answer(Cost, "POST", self._path(protocol.COST, handle),
                                        json_body={"offer": offer.model_dump(mode="json")})



class RemoteExecutor(RunsUntrusted, RemoteBackend):
    """An executor we do not control: it says who it is, signs its commitment and opens what it is challenged on."""

    name = "bittensor"

    async def executor(self, handle: Handle) -> ExecutorIdentity:
        return await self.client.answer(ExecutorIdentity, "GET", self._path(protocol.EXECUTOR, handle))

    async def signed_commitment(self, handle: Handle) -> SignedCommitment:
        return await self.client.answer(SignedCommitment, "GET", self._path(protocol.COMMITMENT, handle))

    async def conclude(self, handle: Handle, conclusion: Conclusion) -> Acknowledgement:
        return await self.client.answer(Acknowledgement, "POST", self._path(protocol.CONCLUDE, handle),
                                        json_body=conclusion.model_dump(mode="json"))

    async def open_segments(self, handle: Handle, indices: list[int], dest: Path) -> Path:
        files = await self._manifest(self._path(protocol.OPENINGS, handle), json_body={"indices": list(indices)})
        for f in files:
            await transfer.download(self.client.reader(self._path(protocol.OPENED_FILE, handle, path=f.path)),
                                    dest / f.path, size=f.size, sha256=f.sha256)
        return dest


class TrustedRemoteExecutor(RemoteBackend):
    """The same client as a trusted backend: registered under a trusted registry entry (`local` in the
    tests), its offers are stamped trusted and a later attempt resumes from an earlier one's checkpoint."""

    name = "local"
