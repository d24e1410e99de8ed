"""The Bittensor backend against real `trainmaster miner serve` processes, its failures classified with their
reasons (broker/failures.py reacts to each type): a resend of a dispatch is answered the same, a miner
with no room refuses (503: CapacityError), a run is followed and cancelled, a miner killed with kill -9
is unreachable (TransientBackendError), and a miner listed under another hotkey or one that does not
serve us refuses our signed request without being blamed for it."""

from __future__ import annotations

import asyncio
import time

import pytest

from miner_jobs import SLEEPER, Secret, bundle, spec
from miner_support import MinerProcess, make_wallet
from trainmaster.backends.base import (
    AttemptContext, CapacityError, ExecutorFault, OfferRequest, Phase, TransientBackendError,
)
from trainmaster.backends.bittensor import protocol
from trainmaster.backends.bittensor.backend import BittensorBackend
from trainmaster.backends.bittensor.config import BittensorConfig
from trainmaster.broker.failures import reaction
from trainmaster.jobs.spec import JobSpec
from trainmaster.wallet.rates import Rate

pytestmark = pytest.mark.slow

PRICES = {"prices": {"rao_per_gpu_hour": {"cpu": 2_000_000_000}}, "default_hours": 0.25, "max_concurrent_jobs": 1}
RATE = Rate(micro_usd_per_tao=400_000_000, taken_at=time.time(), source="fixed")
DEADLINE_S = 120.0


def _backend(tmp_path, *listed: dict) -> BittensorBackend:
    return BittensorBackend(BittensorConfig(wallet={"name": "broker", "path": str(tmp_path / "wallets")},
                                            miners=list(listed)))


async def _offer(backend: BittensorBackend, job: JobSpec):
    found = await backend.offers(OfferRequest(spec=job, rate=RATE, total_steps=50))
    assert len(found.offers) == 1, found.reasons
    return found.offers[0]


def _context(tmp_path, attempt_id: str, sha256: str) -> AttemptContext:
    return AttemptContext(job_id="job-1", attempt_id=attempt_id, bundle_sha256=sha256, seed=11,
                          workdir=str(tmp_path / attempt_id), challenge_digest=Secret().digest)


@pytest.fixture
def own_miner(tmp_path):
    """A miner of the test's own: the test runs a job on it and kills it."""
    proc = MinerProcess(tmp_path / "miner", make_wallet(tmp_path / "wallets", "miner"), config=PRICES).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def miner(tmp_path_factory):
    """One miner for the tests that only ask it (a quote, a hello) and run nothing on it: started once (~10 s on a
    loaded machine); each test signs as a broker wallet of its own."""
    root = tmp_path_factory.mktemp("miner")
    proc = MinerProcess(root / "miner", make_wallet(root / "wallets", "miner"), config=PRICES).start()
    yield proc
    proc.stop()


def test_a_run_is_resent_refused_when_busy_followed_cancelled_and_unreachable_after_kill_9(tmp_path, own_miner):
    miner = own_miner
    make_wallet(tmp_path / "wallets", "broker")
    backend = _backend(tmp_path, {"hotkey": miner.hotkey, "url": miner.url,
                                  "coldkey": miner.wallet.coldkeypub.ss58_address})
    job = JobSpec.model_validate(spec(SLEEPER))
    sha256, data = bundle(tmp_path / "b", job.model_dump(mode="json"))
    path = tmp_path / "bundle.tar"
    path.write_bytes(data)

    async def run():
        ctx = _context(tmp_path, "a1", sha256)
        offer = await _offer(backend, job)
        handle = await backend.submit(path, job, offer, ctx)
        assert await backend.submit(path, job, offer, ctx) == handle  # a resend after a lost answer: the same
        assert handle.data["hotkey"] == miner.hotkey and handle.data["attempt_id"] == "a1"
        identity = await backend.executor(handle)
        assert (identity.hotkey, identity.coldkey) == (miner.hotkey, miner.wallet.coldkeypub.ss58_address)

        with pytest.raises(CapacityError, match="503") as busy:  # max_concurrent_jobs: 1
            await backend.submit(path, job, await _offer(backend, job), _context(tmp_path, "a2", sha256))
        assert reaction(busy.value, trusted=False).job == "fallback"

        deadline = time.monotonic() + DEADLINE_S
        while (await backend.status(handle)).phase is not Phase.running:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        assert (await backend.logs(handle)).offset == 0
        assert (await backend.metrics(handle)).offset == 0
        assert isinstance(await backend.cancel(handle), int)
        while not (status := await backend.status(handle)).phase.done:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        assert status.phase is Phase.cancelled

        # a retry on the same offer: its quote bought a1 (409 "quote already used"), so it is quoted again,
        # at the same price, and dispatched on the fresh quote
        again = await backend.submit(path, job, offer, _context(tmp_path, "a3", sha256))
        assert again.data["quote"]["quote"] != handle.data["quote"]["quote"]
        assert protocol.SignedQuote.model_validate(again.data["quote"]).parsed().rao == \
            protocol.SignedQuote.model_validate(handle.data["quote"]).parsed().rao
        await backend.cancel(again)

        miner.kill9()
        with pytest.raises(TransientBackendError, match=f"miner {miner.hotkey[:8]}… at {miner.url} is unreachable"):
            await backend.status(handle)

    asyncio.run(run())


def test_a_miner_under_another_hotkey_or_not_serving_us_refuses_without_blame(tmp_path, miner):
    make_wallet(tmp_path / "wallets", "broker")
    other = make_wallet(tmp_path / "wallets", "other")
    picky = MinerProcess(tmp_path / "picky", make_wallet(tmp_path / "wallets", "picky"),
                         config={**PRICES, "allow": [other.hotkey.ss58_address]}).start(probe=other)
    try:
        backend = _backend(tmp_path, {"hotkey": other.hotkey.ss58_address, "url": miner.url},
                           {"hotkey": picky.hotkey, "url": picky.url})
        found = asyncio.run(backend.offers(OfferRequest(spec=JobSpec.model_validate(spec()), rate=RATE)))
    finally:
        picky.stop()
    assert found.offers == []
    wrong, unserved = found.reasons
    assert wrong.startswith(f"miner {other.hotkey.ss58_address[:8]}… refused /v1/quote (401 WrongReceiver): "
                            "our signed request was not accepted, which is not counted against it"), wrong
    assert unserved.startswith(f"miner {picky.hotkey[:8]}… refused /v1/quote (403 "), unserved
    assert unserved.endswith("it does not serve our hotkey"), unserved


def test_an_answer_that_is_not_the_protocols_is_the_miners_fault(tmp_path, miner):
    """The miner's `hello` is not a quote: asked as one, the answer is an ExecutorFault (rejected and banned)."""
    from trainmaster.backends.bittensor import protocol
    from trainmaster.backends.bittensor.client import MinerClient
    from trainmaster.backends.bittensor.directory import Miner

    broker = make_wallet(tmp_path / "wallets", "broker")
    client = MinerClient(Miner(hotkey=miner.hotkey, url=miner.url), broker.hotkey)
    with pytest.raises(ExecutorFault, match="not a valid SignedQuote of the protocol") as fault:
        asyncio.run(client.answer(protocol.SignedQuote, "GET", protocol.HELLO))
    assert reaction(fault.value, trusted=False).ban
