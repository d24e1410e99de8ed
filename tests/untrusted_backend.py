"""An untrusted executor for tests: a real LocalBackend run behind a wrapper that behaves like a
rented miner. It quotes in TAO, signs its commitment with a real bittensor sr25519 keypair, keeps
the challenge digest the broker published at dispatch, and opens challenged segments from its own
checkpoint folder through the shared transfer helper (announced size and sha256, streamed).

It lives in tests only: it is the harness the Bittensor backend replaces. `LazyExecutor` cheats
the way a real one would, training with a learning rate other than the spec's and committing
honestly to what it computed.

After the verdict the broker concludes with it: the executor keeps what it was told in its own
folder (`told`, read by the tests across broker processes), checks the revealed challenge secret
against the digest published at dispatch and the broker's signature on the receipt, and countersigns
the receipt with its hotkey, answering a conclusion it was already told with the same countersignature.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import shutil
import time
from pathlib import Path

from trainmaster.backends import transfer
from trainmaster.backends.base import (
    AttemptContext, AttemptStatus, Backend, BackendError, Cost, Handle, LogChunk, Offer, OfferRequest, OfferSet, OutputFile, Phase,
    Progress,
)
from trainmaster.backends.features import Acknowledgement, Conclusion, ExecutorIdentity, RunsUntrusted, SignedCommitment
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
        _publish(Path(ctx.workdir), ctx.challenge_digest)
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
        rate = await self.rates.current() if self.rates else Rate(micro_usd_per_tao=USD_PER_TAO_MICRO, taken_at=time.time(),
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


    async def conclude(self, handle: Handle, conclusion: Conclusion) -> Acknowledgement:
        """Keep what it is told; check the secret and the broker's signature; countersign the receipt
        (the same countersignature for a conclusion it was already told)."""
        from trainmaster.wallet.keys import signed_by

        folder = Path(handle.data["workdir"]) / EXECUTOR_DIR
        told = told_at(folder.parent)
        if told and told[-1]["conclusion"]["receipt"] == conclusion.receipt:
            countersignature = told[-1]["countersignature"]
        else:
            countersignature = "0x" + bytes(self.keypairs[handle.data["hotkey"]].sign(conclusion.receipt.encode())).hex()
        published = (folder / "published").read_text()
        receipt = json.loads(conclusion.receipt)
        told.append({
            "conclusion": conclusion.model_dump(), "countersignature": countersignature,
            "secret_matches_published": hashlib.sha256(bytes.fromhex(conclusion.challenge_secret)).hexdigest() == published,
            "receipt_names_published": receipt["challenge_digest"] == published,
            "broker_signature_valid": signed_by(conclusion.receipt.encode(), conclusion.signature, conclusion.broker),
        })
        (folder / "told.json").write_text(json.dumps(told))
        return Acknowledgement(countersignature=countersignature)


class IdlingExecutor(UntrustedExecutor):
    """Trains honestly, then idles `IDLE_S` seconds before it reports the run done, and bills that time."""

    IDLE_S = 3.0

    async def status(self, handle: Handle) -> AttemptStatus:
        st = await super().status(handle)
        if st.phase.done and time.time() < st.ended_at + self.IDLE_S:
            return AttemptStatus(phase=Phase.running, started_at=st.started_at)
        return st.model_copy(update={"ended_at": st.ended_at + self.IDLE_S}) if st.ended_at else st

    async def cost(self, handle: Handle, offer: Offer) -> Cost:
        cost = await super().cost(handle, offer)
        rao = math.ceil((cost.billable_seconds + self.IDLE_S) * RAO_PER_HOUR / 3600)
        return cost.model_copy(update={"rao": rao, "micro_usd": rao * USD_PER_TAO_MICRO // RAO_PER_TAO,
                                       "billable_seconds": cost.billable_seconds + self.IDLE_S})


FORGED = {"result.json": b'{"score": 0.99}\n', "metrics.jsonl": b'{"step": 100, "score": 0.99}\n'}


class ForgingExecutor(UntrustedExecutor):
    """Trains honestly and returns, beside its committed outputs, another model (`model_best.safetensors`)
    and forged `result.json` and `metrics.jsonl`."""

    async def fetch(self, handle: Handle, dest: Path, progress: Progress | None = None) -> list[OutputFile]:
        import torch
        from safetensors.torch import save_file

        outputs = Path(handle.data["workdir"]) / "outputs"
        save_file({"w": torch.ones(4)}, str(outputs / "model_best.safetensors"))
        for name, data in FORGED.items():
            (outputs / name).write_bytes(data)
        return await super().fetch(handle, dest, progress)


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
        (Path(ctx.workdir) / EXECUTOR_DIR / "told.json").unlink(missing_ok=True)  # what the first attempt was told
        _publish(Path(ctx.workdir), ctx.challenge_digest)
        return Handle(backend=self.name, attempt_id=ctx.attempt_id, data={"workdir": ctx.workdir, "hotkey": offer.instance})


EXECUTOR_DIR = "executor"
"""Where, in an attempt's work folder, the executor keeps what it was published and told."""


class PlainScriptExecutor(UntrustedExecutor):
    """The harness for a plain script: it sends no signed commitment, which a policy without the replay audit lets
    through to the safety check."""

    async def signed_commitment(self, handle):
        if not (Path(handle.data["workdir"]) / "outputs" / "commitment.json").is_file():
            raise BackendError("the run wrote no commitment.json")
        return await super().signed_commitment(handle)


def _publish(workdir: Path, digest: str | None) -> None:
    folder = workdir / EXECUTOR_DIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "published").write_text(digest or "")


def told_at(workdir: Path) -> list[dict]:
    """Every conclusion the executor of the attempt in `workdir` was told, in order, with its checks."""
    path = workdir / EXECUTOR_DIR / "told.json"
    return json.loads(path.read_text()) if path.exists() else []


def _reader(path: Path):
    async def read(offset: int):
        with open(path, "rb") as f:
            f.seek(offset)
            while chunk := await asyncio.to_thread(f.read, 1 << 16):
                yield chunk

    return read


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
