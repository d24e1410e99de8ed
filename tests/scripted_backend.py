"""Scripted backends for the failure and cancel tests: no processes, every answer set by the test.

`Scripted` is a trusted backend (a test gives it as `local` or `aws`); `ScriptedExecutor` an untrusted
one (`bittensor`). Each answers `submit`, `status` and `fetch` from its `Script`: an exception to raise,
or a status to report; a successful fetch writes one small output file. The CLI builds its own broker
and backends from the registry, so the classes registered there (`ScriptedLocal`, `ScriptedAws`,
`ScriptedBittensor`) read their script from the class, which a test sets with monkeypatch.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainmaster.backends import transfer
from trainmaster.backends.base import (
    AttemptContext, AttemptStatus, Backend, Cost, Handle, LogChunk, Offer, OfferSet, OutputFile, Phase, Progress,
)
from trainmaster.backends.features import (
    Acknowledgement, Conclusion, ExecutorIdentity, RunsUntrusted, SignedCommitment,
)
from trainmaster.jobs.spec import JobSpec

SUCCEEDED = AttemptStatus(phase=Phase.succeeded, exit_code=0, started_at=1.0, ended_at=2.0)
RUNNING = AttemptStatus(phase=Phase.running, started_at=1.0)
COST_MICRO_USD = 1_000
KEY_URI = "//Scripted"  # a real sr25519 key: its conclusion's countersignature is checked
HOTKEY, COLDKEY = "5HawfBTmBYdbF1xmWFLGiPQpgATFrvZ77bboztgZSV8ThoxL", "5ScriptedColdkey"  # HOTKEY is KEY_URI's


@dataclass
class Script:
    submit: BaseException | None = None
    status: AttemptStatus | BaseException = SUCCEEDED
    fetch: BaseException | None = None
    announce: str | None = None
    """The sha256 the fetch announces for its one file (None: the true one); the bytes go through the
    broker's real transfer code, which refuses a file whose bytes do not match."""
    calls: list[str] = field(default_factory=list)
    """Every call the broker made, by name, in order."""

    def answer(self, call: str, planned):
        self.calls.append(call)
        if isinstance(planned, BaseException):
            raise planned
        return planned


class Scripted(Backend):
    name = "local"
    trusted = True
    script = Script()

    def __init__(self, config=None, *, name: str | None = None, script: Script | None = None):
        super().__init__(None)
        self.name = name or type(self).name
        self.script = script or type(self).script

    async def offers(self, request) -> OfferSet:
        return OfferSet(backend=self.name, offers=[Offer(backend=self.name, instance=f"{self.name}-1", region="here",
                                                         price_per_hour_micro_usd=1_000_000, trusted=self.trusted,
                                                         detail={"coldkey": COLDKEY})])

    async def submit(self, bundle: Path, spec: JobSpec, offer: Offer, ctx: AttemptContext) -> Handle:
        self.script.answer("submit", self.script.submit)
        return Handle(backend=self.name, attempt_id=ctx.attempt_id, data={"hotkey": offer.instance})

    async def status(self, handle: Handle) -> AttemptStatus:
        return self.script.answer("status", self.script.status)

    async def logs(self, handle: Handle, offset: int = 0) -> LogChunk:
        return LogChunk(text="", offset=offset, next_offset=offset, complete=True)

    async def cancel(self, handle: Handle) -> int:
        self.script.calls.append("cancel")
        return 0

    async def fetch(self, handle: Handle, dest: Path, progress: Progress | None = None) -> list[OutputFile]:
        self.script.answer("fetch", self.script.fetch)
        body = b"weights"

        async def read(offset: int):
            yield body[offset:]

        announced = self.script.announce or hashlib.sha256(body).hexdigest()
        return [await transfer.download(read, dest / "result.txt", size=len(body), sha256=announced)]

    async def cost(self, handle: Handle, offer: Offer) -> Cost:
        self.script.calls.append("cost")
        return Cost(micro_usd=COST_MICRO_USD, billable_seconds=1.0, basis="scripted")


class ScriptedExecutor(RunsUntrusted, Scripted):
    """An untrusted executor: who it is, and no signed commitment (the checks reject its work)."""

    name = "bittensor"
    trusted = False

    async def offers(self, request) -> OfferSet:
        found = await super().offers(request)
        return OfferSet(backend=self.name, offers=[o.model_copy(update={"instance": HOTKEY}) for o in found.offers])

    async def cost(self, handle: Handle, offer: Offer) -> Cost:
        self.script.calls.append("cost")
        return Cost(micro_usd=COST_MICRO_USD, rao=2_500, rate_micro_usd_per_tao=400_000_000, rate_at=time.time(),
                    billable_seconds=1.0, basis="scripted")

    async def executor(self, handle: Handle) -> ExecutorIdentity:
        return ExecutorIdentity(hotkey=HOTKEY, coldkey=COLDKEY)

    async def signed_commitment(self, handle: Handle) -> SignedCommitment:
        from trainmaster.backends.base import BackendError

        raise BackendError("this executor signs nothing")

    async def conclude(self, handle: Handle, conclusion: Conclusion) -> Acknowledgement:
        """Countersign the receipt it is told (what every executor does once its verdict is in)."""
        from bittensor.sp_core import Keypair

        self.script.calls.append("conclude")
        signature = Keypair.create_from_uri(KEY_URI).sign(conclusion.receipt.encode())
        return Acknowledgement(countersignature="0x" + bytes(signature).hex())


class ScriptedLocal(Scripted):
    name = "local"
    script = Script()


class ScriptedAws(Scripted):
    name = "aws"
    script = Script()


class ScriptedBittensor(ScriptedExecutor):
    name = "bittensor"
    script = Script()
