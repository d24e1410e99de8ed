"""BittensorBackend: training runs rented from Bittensor miners, spoken to only through the miner
protocol (protocol.py) over aiohttp, every request signed with the broker's hotkey (client.py).

Miners come from a `MinerDirectory`: the list in backends.yaml when it names any, else the subnet's
metagraph (metagraph.py). Offers are the miners' signed quotes, gathered in parallel (quotes.py); an
attempt is the bundle streamed to the chosen miner and a `Dispatch` naming the signed quote, the
broker's seed and the digest of its challenge secret. The miner is untrusted: its work is replay-audited
(the signed commitment, then the challenged segments streamed and hash-checked) and paid its quoted
price only when accepted. Who ran an attempt is always the directory's word, never the miner's.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import shutil
import time
from pathlib import Path

import aiohttp

from trainmaster.backends import transfer
from trainmaster.backends.base import (
    AttemptContext, AttemptStatus, Backend, BackendError, CapacityError, Cost, ExecutorFault, Handle,
    LocalEnvironmentError, LogChunk, Offer, OfferRequest, OfferSet, OutputFile, Progress,
)
from trainmaster.backends.bittensor import auth, fetch_bounds, protocol, quotes
from trainmaster.backends.bittensor.client import CHUNK, MinerClient, QuoteUsed, target
from trainmaster.backends.bittensor.config import BittensorConfig
from trainmaster.backends.bittensor.directory import Miner, MinerDirectory, StaticDirectory
from trainmaster.backends.features import (
    Acknowledgement, Conclusion, ExecutorIdentity, LeafOpening, MetricsChunk, OpensLeaves, ReportsMetrics,
    SignedCommitment, SupportsMultiGpu,
)
from trainmaster.jobs.spec import JobSpec
from trainmaster.wallet.rates import Rate

UPLOAD_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=300)


class NoDirectory(Exception):
    """Where to find miners is not configured, or not available in this version; the message says what to do."""


class BittensorBackend(OpensLeaves, ReportsMetrics, SupportsMultiGpu, Backend):
    name = "bittensor"
    config_model = BittensorConfig
    unsupported = {
        "multi_node": "a miner runs a job on one machine",
        "spot": "a miner's price holds for the whole run; there is no preemptible tier",
        "remote_data": "a miner is sent the bundle only; it reads no bucket of ours",
        "resumes_from_checkpoints": "a miner's states are audited, never resumed from: a new attempt starts afresh",
    }

    def __init__(self, config: BittensorConfig | None = None):
        super().__init__(config)
        self._signer = None

    # who we are, and whom we ask

    def signer(self):
        """The broker's hotkey keypair (plaintext in the wallet folder, no password), loaded once."""
        if self._signer is None:
            from trainmaster.backends.bittensor import check

            missing = check.hotkey_missing(self.config)
            if missing:
                raise LocalEnvironmentError(missing[0])
            try:
                self._signer = auth.load_hotkey(check.hotkey_file(self.config))
            except (OSError, ValueError) as exc:
                raise LocalEnvironmentError(f"cannot use the hotkey {check.hotkey_file(self.config)}: {exc}") from None
        return self._signer

    def directory(self) -> MinerDirectory:
        if self.config.miners:
            return StaticDirectory(self.config)
        if self.config.netuid is None:
            raise NoDirectory("no miners: list them under bittensor.miners (hotkey and url) in backends.yaml, "
                              "or set bittensor.netuid to find them on the subnet")
        try:
            from trainmaster.backends.bittensor.metagraph import MetagraphDirectory
        except ImportError as exc:
            if "metagraph" not in str(exc):
                raise
            raise NoDirectory("finding miners on the subnet's metagraph is not available in this version "
                              "(backends/bittensor/metagraph.py is absent): list them under bittensor.miners "
                              "(hotkey and url) in backends.yaml") from None
        return MetagraphDirectory(self.config)

    def _client(self, handle: Handle, timeout=None) -> MinerClient:
        miner = Miner(hotkey=handle.data["hotkey"], url=handle.data["url"], coldkey=handle.data.get("coldkey"))
        return MinerClient(miner, self.signer(), **({"timeout": timeout} if timeout else {}))

    @staticmethod
    def _at(template: str, handle: Handle, query: dict[str, int] | None = None, **values: str) -> str:
        return target(template, query, attempt_id=handle.data["attempt_id"], **values)

    # offers

    async def offers(self, request: OfferRequest) -> OfferSet:
        if request.rate is None:
            return OfferSet(backend=self.name, reasons=["no TAO/USD rate: set the policy's tao_rate "
                                                        "(usd_per_tao or source) to price miners' quotes"])
        try:
            signer = self.signer()
            miners = await self.directory().miners()
        except (NoDirectory, LocalEnvironmentError) as exc:
            return OfferSet(backend=self.name, reasons=[str(exc)])
        if not miners:
            return OfferSet(backend=self.name, reasons=["the directory lists no miner serving now"])
        offers, reasons = await quotes.gather(miners[: self.config.max_miners], signer, signer.ss58_address, request,
                                              request.rate, self.config.quote_timeout_s)
        return OfferSet(backend=self.name, offers=offers, reasons=reasons)

    # an attempt

    async def submit(self, bundle: Path, spec: JobSpec, offer: Offer, ctx: AttemptContext) -> Handle:
        """The bundle streamed to the offer's miner, then the dispatch; a resend after a lost answer is the
        same request (the miner answers it the same, on the attempt id)."""
        if ctx.challenge_digest is None:
            raise BackendError("an attempt on an untrusted miner needs the digest of its challenge secret")
        handle = Handle(backend=self.name, attempt_id=ctx.attempt_id, data={
            "url": offer.detail["url"], "hotkey": offer.instance, "coldkey": offer.detail.get("coldkey"),
            "attempt_id": ctx.attempt_id, "quote": offer.detail["signed_quote"],
            "outputs_max_bytes": int(spec.outputs.max_gb * 1e9) if spec.outputs.max_gb else None})
        await self._upload(handle, bundle, ctx.bundle_sha256)
        dispatch = protocol.Dispatch(
            attempt_id=ctx.attempt_id, job_id=ctx.job_id, spec=spec.model_dump(mode="json"),
            quote=protocol.SignedQuote.model_validate(offer.detail["signed_quote"]),
            bundle_sha256=ctx.bundle_sha256, seed=ctx.seed, challenge_digest=ctx.challenge_digest)
        client = self._client(handle)
        try:
            got = await client.answer(protocol.Accepted, "POST", protocol.ATTEMPTS, dispatch)
        except QuoteUsed:  # a retry on the same offer: its quote bought the earlier attempt
            fresh = await self._requote(offer, spec, dispatch.quote)
            handle = handle.model_copy(update={"data": {**handle.data, "quote": fresh.model_dump()}})
            got = await client.answer(protocol.Accepted, "POST", protocol.ATTEMPTS,
                                      dispatch.model_copy(update={"quote": fresh}))
        if got.attempt_id != ctx.attempt_id:
            raise ExecutorFault(f"{client.who} accepted attempt {got.attempt_id[:80]!r}, not {ctx.attempt_id}")
        return handle

    async def _requote(self, offer: Offer, spec: JobSpec, used: protocol.SignedQuote) -> protocol.SignedQuote:
        """A fresh quote of the offer's miner for the same work at the same price (what the attempt was planned
        and reserved at); CapacityError, so the next offer is tried, when the miner now asks otherwise."""
        miner = Miner(hotkey=offer.instance, url=offer.detail["url"], coldkey=offer.detail.get("coldkey"))
        old, signer = used.parsed(), self.signer()
        ask = protocol.QuoteRequest(spec=spec.model_dump(mode="json"), total_steps=old.total_steps)
        signed = await MinerClient(miner, signer).answer(protocol.SignedQuote, "POST", protocol.QUOTE, ask)
        try:
            new = quotes.believed(signed, miner, signer.ss58_address, ask.spec)
        except quotes.QuoteRefused as exc:
            raise ExecutorFault(f"asked again for its quote: {exc}") from None
        if (new.rao, new.gpu_type, new.gpu_count) != (old.rao, old.gpu_type, old.gpu_count):
            raise CapacityError(f"miner {miner.hotkey[:8]}… quotes {new.rao} rao now, not the {old.rao} rao the "
                                f"attempt was planned at")
        return signed

    async def _upload(self, handle: Handle, bundle: Path, sha256: str) -> None:
        async def chunks():
            with open(bundle, "rb") as f:
                while chunk := await asyncio.to_thread(f.read, CHUNK):
                    yield chunk

        client = self._client(handle, UPLOAD_TIMEOUT)
        got = await client.call("PUT", target(protocol.BUNDLE, sha256=sha256), data=chunks())
        if got.get("sha256") != sha256:
            raise ExecutorFault(f"{client.who} stored the bundle under another sha256")

    async def status(self, handle: Handle) -> AttemptStatus:
        return await self._client(handle, self._status_timeout()).answer(AttemptStatus, "GET",
                                                                         self._at(protocol.STATUS, handle))

    async def logs(self, handle: Handle, offset: int = 0) -> LogChunk:
        return await self._client(handle, self._status_timeout()).answer(
            LogChunk, "GET", self._at(protocol.LOGS, handle, {"offset": offset}))

    async def metrics(self, handle: Handle, offset: int = 0, limit: int = 2**16) -> MetricsChunk:
        got = await self._client(handle, self._status_timeout()).answer(protocol.Metrics, "GET",
                                                self._at(protocol.METRICS, handle, {"offset": offset, "limit": limit}))
        try:
            data = base64.b64decode(got.data, validate=True)
        except (binascii.Error, ValueError):
            raise ExecutorFault("metrics: the chunk's data is not base64") from None
        return MetricsChunk(data=data[:limit], offset=got.offset, size=got.size, modified_at=got.modified_at)

    async def cancel(self, handle: Handle) -> int:
        return (await self._client(handle).answer(protocol.Cancelled, "POST", self._at(protocol.CANCEL, handle))).stopped

    async def fetch(self, handle: Handle, dest: Path, progress: Progress | None = None) -> list[OutputFile]:
        """Each output streamed (resuming with `Range`) into a sibling folder, checked against its announced
        size and sha256, and the folder renamed to `dest` once all arrived; an existing `dest` is listed.
        Bounded before a byte is written (the announced sizes against the spec's outputs.max_gb and the free
        disk) and in time (a deadline from the announced size at a floor rate): fetch_bounds.py. What a miner
        sent that is refused, or a disk that filled, leaves nothing behind."""
        if dest.exists():
            return await asyncio.to_thread(transfer.list_files, dest)
        client = self._client(handle, self._status_timeout())
        files = (await client.answer(protocol.Files, "GET", self._at(protocol.OUTPUTS, handle))).files
        tmp = dest.with_name(f".{dest.name}{transfer.PARTIAL}")
        bounds, total = self._bounds(handle), sum(f.size for f in files)
        try:
            have = await asyncio.to_thread(fetch_bounds.partial_bytes, tmp)
            fetch_bounds.check_announced(client.who, [f.size for f in files], bounds, dest, have)
            until = fetch_bounds.deadline(dest, total, bounds)
            if time.time() >= until:
                raise fetch_bounds.too_slow(client.who, have, total, bounds)
            async def every_file() -> None:
                for f in files:
                    await transfer.download(client.reader(self._at(protocol.OUTPUT_FILE, handle, path=f.path), f.size),
                                            tmp / f.path, size=f.size, sha256=f.sha256, progress=progress)

            try:  # (asyncio.wait_for, not asyncio.timeout: Python 3.10 has no asyncio.timeout)
                await asyncio.wait_for(every_file(), until - time.time())
            except asyncio.TimeoutError:  # (3.10's is not the builtin TimeoutError)
                raise fetch_bounds.too_slow(client.who, await asyncio.to_thread(fetch_bounds.partial_bytes, tmp),
                                            total, bounds) from None
        except (ExecutorFault, LocalEnvironmentError):
            await asyncio.to_thread(shutil.rmtree, tmp, True)  # refused bytes, or a full disk: nothing is kept
            fetch_bounds.done(dest)
            raise
        await asyncio.to_thread(tmp.mkdir, parents=True, exist_ok=True)
        os.replace(tmp, dest)
        fetch_bounds.done(dest)
        return files

    def _bounds(self, handle: Handle) -> fetch_bounds.Bounds:
        return fetch_bounds.Bounds(max_bytes=handle.data.get("outputs_max_bytes"),
                                   floor_bytes_per_s=int(self.config.download_floor_kb_s * 1000),
                                   grace_s=self.config.download_grace_s)

    @property
    def overrun_grace_s(self) -> float:
        return self.config.overrun_grace_s

    def _status_timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=self.config.status_timeout_s, sock_connect=5)

    async def cost(self, handle: Handle, offer: Offer) -> Cost:
        """The quoted price of the job's work (paid once, only when accepted), valued at the broker's rate."""
        quote = protocol.SignedQuote.model_validate(handle.data["quote"]).parsed()
        st = await self.status(handle)
        seconds = max(0.0, (st.ended_at or time.time()) - st.started_at) if st.started_at else 0.0
        rate = await self._rate(offer)
        return Cost(micro_usd=rate.micro_usd(quote.rao), rao=quote.rao, rate_micro_usd_per_tao=rate.micro_usd_per_tao,
                    rate_at=rate.taken_at, billable_seconds=seconds,
                    basis=f"the miner's signed quote {quote.quote_id}: {quote.rao} rao for the job's work "
                          f"({quote.hours:g} h at {quote.rao_per_hour} rao/h)")

    async def _rate(self, offer: Offer) -> Rate:
        if self.rates is not None:
            return await self.rates.current()
        if "micro_usd_per_tao" in offer.quote:
            return Rate(micro_usd_per_tao=offer.quote["micro_usd_per_tao"], taken_at=offer.quote["rate_at"],
                        source=str(offer.quote.get("rate_source", "the offer's quote")))
        raise BackendError("no TAO/USD rate to value the miner's price with")

    # the untrusted path

    async def executor(self, handle: Handle) -> ExecutorIdentity:
        return ExecutorIdentity(hotkey=handle.data["hotkey"], coldkey=handle.data.get("coldkey"))

    async def signed_commitment(self, handle: Handle) -> SignedCommitment:
        return await self._client(handle).answer(SignedCommitment, "GET", self._at(protocol.COMMITMENT, handle))

    async def open_segments(self, handle: Handle, indices: list[int], dest: Path, *, boundaries: bool = True) -> Path:
        """The challenge sent (after the commitment is stored), then each file it announces streamed into
        `dest` (the runtime's checkpoint layout), checked against its announced size and sha256."""
        client = self._client(handle)
        files = (await client.answer(protocol.Files, "POST", self._at(protocol.CHALLENGE, handle),
                                     protocol.Challenge(indices=list(indices), boundaries=boundaries))).files
        for f in files:
            await transfer.download(client.reader(self._at(protocol.CHALLENGED_FILE, handle, path=f.path)),
                                    dest / f.path, size=f.size, sha256=f.sha256)
        return dest

    async def open_leaves(self, handle: Handle, indices: list[int]) -> list[LeafOpening]:
        got = await self._client(handle).answer(protocol.LeafOpenings, "POST", self._at(protocol.LEAVES, handle),
                                                protocol.Leaves(indices=list(indices)))
        return list(got.leaves)

    async def open_state(self, handle: Handle, index: int, dest: Path) -> Path:
        return await self.open_segments(handle, [index], dest, boundaries=False)

    async def conclude(self, handle: Handle, conclusion: Conclusion) -> Acknowledgement:
        return await self._client(handle).answer(Acknowledgement, "POST", self._at(protocol.CONCLUDE, handle),
                                                 conclusion)
