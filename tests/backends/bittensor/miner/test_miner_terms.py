"""The terms of a miner's quote (backends/bittensor/miner/terms.py), through a real miner process: a quote buys one
dispatch (another attempt on it is 409, also after the miner is killed with kill -9 and started again; the same
attempt resent is answered as before), and a run is stopped at the quoted hours by the local backend's time limit,
its status saying so (default_hours 0.0005 ≈ 2 s, a job that sleeps for 120 s)."""

from __future__ import annotations

import pytest

from miner_jobs import SLEEPER, Secret, bundle, dispatch_body, quote, spec, upload, wait_done
from miner_support import MinerClient, MinerProcess, make_wallet
from trainmaster.backends.base import AttemptStatus, Phase
from trainmaster.backends.bittensor import protocol
from trainmaster.backends.bittensor.miner import terms
from trainmaster.jobs.spec import JobSpec

CONFIG = {"prices": {"rao_per_gpu_hour": {"cpu": 1_000_000}}, "default_hours": 0.0005, "max_concurrent_jobs": 2}


@pytest.fixture
def miner(tmp_path):
    keys = {name: make_wallet(tmp_path / "wallets", name) for name in ("miner", "broker")}
    proc = MinerProcess(tmp_path / "miner", keys["miner"], config=CONFIG).start()
    yield proc, MinerClient(proc, keys["broker"])
    proc.stop()


def _ready(client: MinerClient, root, job: dict) -> tuple[protocol.SignedQuote, str]:
    """A quote for `job` and its bundle uploaded: (the signed quote, the bundle's sha256)."""
    sha256, data = bundle(root, job)
    assert upload(client, data).status == 200
    return quote(client, job), sha256


def test_a_quote_buys_one_dispatch_even_after_a_restart(miner, tmp_path):
    proc, client = miner
    job = spec(SLEEPER, estimated_hours=1)
    signed, sha256 = _ready(client, tmp_path / "job", job)
    first = dispatch_body("a1", job, signed, sha256, Secret())
    accepted = client.call("POST", protocol.ATTEMPTS, first)
    assert accepted.status == 200, accepted.body
    for restart in (False, True):
        if restart:
            proc.kill9()
            proc.restart()
        again = client.call("POST", protocol.ATTEMPTS, dispatch_body("a2", job, signed, sha256, Secret()))
        assert (again.status, again.json()) == (409, {"error": "quote already used"})
        resent = client.call("POST", protocol.ATTEMPTS, first)
        assert (resent.status, resent.body) == (200, accepted.body)
    assert client.call("GET", protocol.route(protocol.STATUS, attempt_id="a2")).status == 404
    fresh = dispatch_body("a3", job, quote(client, job), sha256, Secret())  # a new quote is a new dispatch
    assert client.call("POST", protocol.ATTEMPTS, fresh).status == 200


def test_a_run_is_stopped_at_the_quoted_hours_or_sooner_at_its_own_limit(miner, tmp_path):
    _, client = miner
    quoted = spec(SLEEPER)  # priced at default_hours: 0.0005 h = 1.8 s
    own = spec(SLEEPER, estimated_hours=1, limits={"max_hours": 0.0003})  # priced for 1 h, limited to ~1 s
    for attempt_id, job in (("quoted", quoted), ("own", own)):
        signed, sha256 = _ready(client, tmp_path / attempt_id, job)
        assert signed.parsed().hours == (0.0005 if job is quoted else 1)
        answer = client.call("POST", protocol.ATTEMPTS, dispatch_body(attempt_id, job, signed, sha256, Secret()))
        assert answer.status == 200, answer.body
    status = wait_done(client, "quoted")
    assert (status["phase"], status["exit_code"], status["reason"]) == ("failed", 124, "ran past the quoted 0.0005 h")
    status = wait_done(client, "own")
    assert (status["phase"], status["exit_code"]) == ("failed", 124)
    assert status["reason"].startswith("time limit reached: limits.max_hours = 0.0003")


def _quote(hours: float) -> protocol.Quote:
    return protocol.Quote(quote_id="ab" * 16, miner="m", broker="b", spec_sha256="cd" * 32, rao_per_hour=10,
                          hours=hours, rao=10, valid_until=0)


def test_the_held_spec_and_the_reason_told():
    job = JobSpec.model_validate(spec(SLEEPER, limits={"max_hours": 2, "max_usd": 5}))
    assert terms.held_to(job, _quote(0.5)).limits.max_hours == 0.5
    assert terms.held_to(job, _quote(3)).limits.max_hours == 2
    assert terms.held_to(job, _quote(0.5)).limits.max_usd == job.limits.max_usd and job.limits.max_hours == 2
    stopped = AttemptStatus(phase=Phase.failed, exit_code=124, reason="time limit reached: x", started_at=0,
                            ended_at=1800.5)
    assert terms.told(stopped, _quote(0.5)).reason == "ran past the quoted 0.5 h"
    assert terms.told(stopped, _quote(1)).reason == "time limit reached: x"  # its own, sooner limit
    exited = stopped.model_copy(update={"reason": "exit code 124"})
    assert terms.told(exited, _quote(0.5)) == exited  # the job's own exit code 124 is not a time limit
