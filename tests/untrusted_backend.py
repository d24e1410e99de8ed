"""An untrusted executor for tests: a real LocalBackend run behind a wrapper that behaves like a
rented miner. It quotes in TAO, signs its commitment with a real bittensor sr25519 keypair, keeps
the challenge digest the broker published at dispatch, and opens challenged segments from its own
checkpoint folder through the shared transfer helper (announced size and sha256, streamed).

It lives in tests only: it is the harness the Bittensor backend replaces. `LazyExecutor` cheats
the way a real one would, training with a learning rate other than the spec's and committing
honestly to what it computed.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import shutil
import time
from pathlib import Path

from trainmaster.backends import transfer
from trainmaster.backends.base import (
    AttemptContext, AttemptStatus, Backend, Cost, Handle, LogChunk, Offer, OfferRequest, OfferSet, OutputFile, Phase,
    Progress,
)
from trainmaster.backends.features import ExecutorIdentity, RunsUntrusted, SignedCommitment
from trainmaster.backends.local import LocalBackend
from trainmaster.jobs.checkpoint import MANIFEST, segment_dir, segment_indices
from trainmaster.jobs.spec import JobSpec
from trainmaster.wallet.rates import Rate

RAO_PER_TAO = 10**9
USD_PER_TAO_MICRO = 400_000_000  # $400 per TAO
RAO_PER_HOUR = 2 * RAO_PER_TAO  # 2 TAO an hour
URI = "//Alice"


class UntrustedExecutor(RunsUntrusted, Backend):
    name = "bittensor"

    def __init__(self, config=None, *, uris: tuple[str, ...] = (URI,), coldkeys: tuple[str | None, ...] | None = None):
        super().__init__(None)
        from bittensor.sp_core import Keypair

        pairs = [Keypair.create_from_uri(uri) for uri in uris]
        self.keypair = pairs[0]
        self.keypairs = {pair.ss58_address: pair for pair in pairs}
        self.coldkeys = dict(zip(self.keypairs, coldkeys or (None,) * len(pairs)))
        self.local = LocalBackend()
        self.published: dict[str, str | None] = {}
        """attempt id -> the challenge digest the broker published at dispatch."""
        self.opened: list[list[int]] = []
        """Every set of segment indices the broker asked to open, in order."""
        self.seeds: dict[str, int] = {}
        """attempt id -> the seed the broker gave it."""

    def _inner(self, handle: Handle) -> Handle:
        return Handle(backend="local", attempt_id=handle.attempt_id, data=handle.data)

    async def offers(self, request: OfferRequest) -> OfferSet:
        found = await self.local.offers(request)
        rate = request.rate  # the broker's TAO/USD rate, when its policy sets one

        def usd(rao: int) -> int:
            return rate.micro_usd(rao) if rate else rao * USD_PER_TAO_MICRO // RAO_PER_TAO

        offers = []
        for rank, (hotkey, coldkey) in enumerate(self.coldkeys.items()):  # the first key is the cheapest
            rao = RAO_PER_HOUR + rank * RAO_PER_TAO // 10
            offers += [Offer(**{**o.model_dump(), "backend": self.name, "instance": hotkey, "region": "subnet",
                                "trusted": False, "price_per_hour_rao": rao,
                                "price_per_hour_micro_usd": usd(rao),
                                "detail": {**o.detail, "coldkey": coldkey},
                                "quote": {"source": f"the miner's quote ({rao} rao/h)"}})
                       for o in found.offers]
        return OfferSet(backend=self.name, reasons=found.reasons, offers=offers)

    def executed(self, spec: JobSpec) -> JobSpec:
        """The spec this executor actually runs (an honest one runs the spec as given)."""
        return spec

    async def submit(self, bundle: Path, spec: JobSpec, offer: Offer, ctx: AttemptContext) -> Handle:
        self.published[ctx.attempt_id] = ctx.challenge_digest
        self.seeds[ctx.attempt_id] = ctx.seed
        handle = await self.local.submit(bundle, self.executed(spec), offer, ctx)
        return Handle(backend=self.name, attempt_id=handle.attempt_id, data={**handle.data, "hotkey": offer.instance})

    async def status(self, handle: Handle) -> AttemptStatus:
        return await self.local.status(self._inner(handle))

    async def logs(self, handle: Handle, offset: int = 0) -> LogChunk:
        return await self.local.logs(self._inner(handle), offset)

    async def cancel(self, handle: Handle) -> int | None:
        return await self.local.cancel(self._inner(handle))

    async def fetch(self, handle: Handle, dest: Path, progress: Progress | None = None) -> list[OutputFile]:
        return await self.local.fetch(self._inner(handle), dest, progress)

    async def cost(self, handle: Handle, offer: Offer) -> Cost:
        seconds = (await self.local.cost(self._inner(handle), offer)).billable_seconds
        rao = math.ceil(seconds * RAO_PER_HOUR / 3600)
        rate = self.rates.current() if self.rates else Rate(micro_usd_per_tao=USD_PER_TAO_MICRO, taken_at=time.time(),
                                                            source="the harness's own $400")
        return Cost(micro_usd=rate.micro_usd(rao), rao=rao, rate_micro_usd_per_tao=rate.micro_usd_per_tao,
                    rate_at=rate.taken_at, billable_seconds=seconds, basis=f"{seconds:.1f} s × {RAO_PER_HOUR} rao/h")

    # the untrusted path

    async def executor(self, handle: Handle) -> ExecutorIdentity:
        hotkey = handle.data["hotkey"]
        return ExecutorIdentity(hotkey=hotkey, coldkey=self.coldkeys[hotkey])

    async def signed_commitment(self, handle: Handle) -> SignedCommitment:
        from trainmaster.jobs.commitment import read_commitment
        from trainmaster.jobs.signing import sign_commitment

        path = Path(handle.data["workdir"]) / "outputs" / "commitment.json"
        keypair = self.keypairs[handle.data["hotkey"]]
        return SignedCommitment(commitment=path.read_text(), signature=sign_commitment(read_commitment(path), keypair))

    async def open_segments(self, handle: Handle, indices: list[int], dest: Path) -> Path:
        """Every segment's manifest (its leaf, for the proofs) and the full files of each challenged
        segment and the state after it, streamed with their announced size and sha256."""
        self.opened.append(list(indices))
        source = Path(handle.data["workdir"]) / "checkpoints"
        wanted = {i for i in indices} | {i + 1 for i in indices}
        for index in segment_indices(source):
            here = segment_dir(source, index)
            for path in sorted(here.iterdir()) if index in wanted else [here / MANIFEST]:
                target = segment_dir(dest, index) / path.name
                await transfer.download(_reader(path), target, size=path.stat().st_size, sha256=_sha256(path))
        return dest


class LazyExecutor(UntrustedExecutor):
    """Trains with 0.9 × the spec's learning rate (saving nothing, but not what was paid for) and
    commits honestly to the states it computed."""

    def executed(self, spec: JobSpec) -> JobSpec:
        return spec.model_copy(update={"entrypoint": f"{spec.entrypoint} --lr 0.0027"})


class TrustClaimingExecutor(LazyExecutor):
    """Trains lazily and claims, in every offer it makes, to be the user's own trusted local machine
    (which would skip the replay audit and pay a failed attempt)."""

    async def offers(self, request: OfferRequest) -> OfferSet:
        found = await super().offers(request)
        return OfferSet(backend=found.backend, reasons=found.reasons,
                        offers=[o.model_copy(update={"trusted": True, "backend": "local"}) for o in found.offers])


class VanishingExecutor(LazyExecutor):
    """Trains (lazily) to the end, committing every segment, then reports the run lost (no exit code),
    as a miner that vanished would: its states stay behind in the attempt's folder."""

    async def status(self, handle: Handle) -> AttemptStatus:
        st = await super().status(handle)
        if st.phase.done:
            return AttemptStatus(phase=Phase.failed, reason="the executor vanished", started_at=st.started_at,
                                 ended_at=st.ended_at)
        return st


class SilentExecutor(LazyExecutor):
    """Trains lazily and, once it sees which segments are challenged, answers with a stream that stops
    half-way, every time it is asked (what an executor that would fail the audit would rather do)."""

    async def open_segments(self, handle: Handle, indices: list[int], dest: Path) -> Path:
        self.opened.append(list(indices))
        path = segment_dir(Path(handle.data["workdir"]) / "checkpoints", indices[0]) / MANIFEST
        half = path.stat().st_size // 2

        async def truncated(offset: int):
            yield path.read_bytes()[offset:half]

        await transfer.download(truncated, segment_dir(dest, indices[0]) / MANIFEST, size=path.stat().st_size,
                                sha256=_sha256(path))
        raise AssertionError("unreachable: the download of a truncated stream fails")


class ReusingExecutor(LazyExecutor):
    """Trains lazily once; every later attempt it gets returns that first run again, signed with the
    hotkey of the new offer, without training (the 'same faked run under a new hotkey' attack)."""

    async def submit(self, bundle: Path, spec: JobSpec, offer: Offer, ctx: AttemptContext) -> Handle:
        if not self.published:
            return await super().submit(bundle, spec, offer, ctx)
        self.published[ctx.attempt_id] = ctx.challenge_digest
        first = Path(ctx.workdir).parent / "1"
        await asyncio.to_thread(shutil.copytree, first, ctx.workdir, dirs_exist_ok=True, symlinks=True)
        return Handle(backend=self.name, attempt_id=ctx.attempt_id, data={"workdir": ctx.workdir, "hotkey": offer.instance})


def _reader(path: Path):
    async def read(offset: int):
        with open(path, "rb") as f:
            f.seek(offset)
            while chunk := await asyncio.to_thread(f.read, 1 << 16):
                yield chunk

    return read


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
