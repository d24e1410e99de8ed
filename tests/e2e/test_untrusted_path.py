"""The untrusted path end to end: a real local run behind an executor we do not trust (tests/untrusted_backend.py),
signed with a real sr25519 key, audited by replay, and paid in TAO only when accepted."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from broker_support import SyncBroker
from trainmaster.broker import paths
from untrusted_backend import RAO_PER_HOUR, RAO_PER_TAO, USD_PER_TAO_MICRO, LazyExecutor, ReusingExecutor, UntrustedExecutor

pytestmark = pytest.mark.slow

# 40 AdamW steps of a small transformer, k = 10: 4 segments, all audited (q = 8 > n − 2). What is proved is about
# the segments, the audit, the keys and the money, not the training's length (tests/tiny_lm_job.py `short_job`);
# the runtime's self-check is off, as there, for the same reason.
JOB = """\
name: lm
entrypoint: python -m trainmaster.jobs.recipes.tiny_lm --steps 40 --d-model 32 --layers 1 --seq-len 16 --batch-size 8 --warmup 10
seed: 3
checkpoint:
  segment_steps: 10
  selfcheck: false
"""
POLICY = """\
name: untrusted
default:
  primary: bittensor
verification:
  tau: 0.01
"""


@pytest.fixture
def job(tmp_path):
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "untrusted.yaml").write_text(POLICY)
    return tmp_path


def _ledger_rows(job_id):
    from trainmaster.wallet.ledger import Ledger

    with Ledger(paths.state_db()) as ledger:
        return [e for e in ledger.entries() if e.job_id == job_id]


def _secret(job_id, attempt_id) -> bytes:
    from trainmaster.verify.records import SecretStore

    store = SecretStore(paths.state_db())
    try:
        return store.reveal(job_id, attempt_id)
    finally:
        store.close()


def test_an_honest_untrusted_attempt_is_audited_accepted_and_paid_in_tao(tm_home, job):
    executor = UntrustedExecutor()
    from trainmaster.broker.service import Broker

    broker = SyncBroker(Broker(backends={"bittensor": executor}))
    done = broker.wait(broker.submit(job / "job.yaml", str(job / "untrusted.yaml")).id, timeout_s=240)
    assert done.state == "accepted", done.reason
    [attempt] = broker.store.attempts(done.id)
    # dispatch recorded who runs it and published the challenge secret's digest
    assert attempt.executor_hotkey == executor.keypair.ss58_address
    assert executor.published[attempt.id] == hashlib.sha256(_secret(done.id, attempt.id)).hexdigest()
    # the audit asked the executor to open the challenged segments, after it committed
    verdict = json.loads((paths.job_dir(done.id) / "verdict.json").read_text())
    assert verdict["checks"] == ["integrity", "safety", "replay", "outcome"]
    assert verdict["evidence"]["integrity"]["signature"] == f"valid for {executor.keypair.ss58_address}"
    assert executor.opened == [[0, 1, 2, 3]]
    # paid once, in rao: the price agreed at dispatch (the offer's rao/h × the planned hours), reserved with
    # the exchange rate it was priced at
    rows = _ledger_rows(done.id)
    assert [r.kind for r in rows] == ["reserve", "charge"]
    reserve, charge = rows
    assert charge.rao == attempt.cost_rao == reserve.rao == round(RAO_PER_HOUR * reserve.detail["hours"]) > 0
    assert charge.rate_micro_usd_per_tao == attempt.cost_rate_micro_usd_per_tao == USD_PER_TAO_MICRO
    assert charge.micro_usd == attempt.cost_micro_usd == attempt.cost_rao * USD_PER_TAO_MICRO // RAO_PER_TAO
    assert charge.micro_usd <= reserve.micro_usd
    assert attempt.cost_rate_at == reserve.at  # the rate was fixed at dispatch
    # it ran from a seed the broker derived from a nonce of its own, not the spec's 3
    from trainmaster.broker.stages.dispatch import attempt_seed

    [nonce] = [e.detail["seed_nonce"] for e in broker.store.events(done.id) if e.detail and "seed_nonce" in e.detail]
    assert executor.seeds[attempt.id] == attempt.seed == attempt_seed(3, nonce) != 3
    # … and the audit holds it to that seed: the same run checked as if run from the spec's seed fails at S_0
    _reverified_with_seed(done, attempt, broker.spec(done), seed=3)
    broker.close()


def _reverified_with_seed(job, attempt, spec, *, seed):
    from trainmaster.verify import pipeline
    from trainmaster.verify.openings import LocalOpenings

    request = pipeline.Attempt(
        job_id=job.id, attempt_id=f"{attempt.id}-again", outputs=paths.job_dir(job.id) / "outputs",
        bundle_sha256=job.bundle_sha256, spec=spec, trusted=False, hotkey=attempt.executor_hotkey,
        signature=_signature(job, attempt),
        openings=LocalOpenings(paths.attempt_dir(job.id, 1) / "checkpoints"), seed=seed,
    )
    verdict = pipeline.verify_attempt(request, db_path=paths.home() / "other.db", write_verdict=False,
                                      audit_settings=pipeline.AuditSettings(tau=0.01))
    assert verdict.outcome == "rejected" and "segment 0" in " ".join(verdict.reasons), verdict.reasons


def _signature(job, attempt) -> str:
    from bittensor.sp_core import Keypair

    from trainmaster.jobs.commitment import read_commitment
    from trainmaster.jobs.signing import sign_commitment

    return sign_commitment(read_commitment(paths.job_dir(job.id) / "outputs" / "commitment.json"),
                           Keypair.create_from_uri("//Alice"))


def test_the_same_run_signed_again_by_a_new_hotkey_is_refused(tm_home, job):
    executor = ReusingExecutor(uris=("//Alice", "//Bob"), coldkeys=("cold-a", "cold-b"))
    from trainmaster.broker.service import Broker

    broker = SyncBroker(Broker(backends={"bittensor": executor}))
    done = broker.wait(broker.submit(job / "job.yaml", str(job / "untrusted.yaml")).id, timeout_s=240)
    assert done.state == "failed"
    first, second = broker.store.attempts(done.id)
    assert first.state == second.state == "rejected" and first.executor_hotkey != second.executor_hotkey
    assert "replay audit failed" in first.reason
    assert "already committed by attempt" in second.reason, second.reason
    assert [r.kind for r in _ledger_rows(done.id)] == ["reserve", "release", "reserve", "release"]
    broker.close()


def test_an_executor_caught_once_is_banned_with_every_hotkey_of_its_coldkey(tm_home, job):
    executor = LazyExecutor(uris=("//Alice", "//Bob"), coldkeys=("cold-a", "cold-a"))
    from trainmaster.broker.service import Broker

    broker = SyncBroker(Broker(backends={"bittensor": executor}))
    done = broker.wait(broker.submit(job / "job.yaml", str(job / "untrusted.yaml")).id, timeout_s=240)
    [attempt] = broker.store.attempts(done.id)  # //Bob, the same owner, is never tried
    assert attempt.state == "rejected" and attempt.executor_coldkey == "cold-a"
    assert done.state == "failed" and "2 offers: its executor is banned" in done.reason, done.reason
    broker.close()


def test_a_lazy_executor_is_rejected_by_the_audit_and_not_paid(tm_home, job):
    executor = LazyExecutor()
    from trainmaster.broker.service import Broker

    broker = SyncBroker(Broker(backends={"bittensor": executor}))
    done = broker.wait(broker.submit(job / "job.yaml", str(job / "untrusted.yaml")).id, timeout_s=240)
    assert done.state == "failed"
    [attempt] = broker.store.attempts(done.id)
    assert attempt.state == "rejected" and "replay audit failed" in attempt.reason, attempt.reason
    assert attempt.cost_rao > 0  # the work was priced …
    assert [r.kind for r in _ledger_rows(done.id)] == ["reserve", "release"]  # … and not paid
    assert "its executor is banned" in done.reason  # the only offer is banned: nothing left to try
    broker.close()


def test_through_the_cli_the_honest_executor_is_accepted(tm_home, job, monkeypatch):
    """`trainmaster submit --wait --json` with the registry's bittensor entry pointing at the harness."""
    from typer.testing import CliRunner

    from trainmaster.backends import registry
    from trainmaster.broker.cli import app

    harness = "untrusted_backend:UntrustedExecutor"
    monkeypatch.setitem(registry.REGISTRY, "bittensor", dataclasses.replace(registry.REGISTRY["bittensor"], target=harness))
    monkeypatch.setitem(registry.BACKENDS, "bittensor", harness)
    result = CliRunner().invoke(app, ["submit", str(job / "job.yaml"), "--policy", str(job / "untrusted.yaml"),
                                      "--wait", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output[result.output.index("{"):])
    assert shown["state"] == "accepted"
    [attempt] = shown["attempts"]
    assert attempt["backend"] == "bittensor"
    status = CliRunner().invoke(app, ["status", shown["id"], "--json"])
    assert status.exit_code == 0 and json.loads(status.output)["state"] == "accepted"


def test_trust_is_the_registered_backends_never_the_offers(tm_home, job, monkeypatch):
    """An executor registered as `bittensor` (untrusted) whose offers say `trusted: true, backend: local`:
    through `trainmaster submit`, its attempt is still a bittensor one, replay-audited, rejected and unpaid."""
    from typer.testing import CliRunner

    from trainmaster.backends import registry
    from trainmaster.broker.cli import app

    harness = "untrusted_backend:TrustClaimingExecutor"
    monkeypatch.setitem(registry.REGISTRY, "bittensor", dataclasses.replace(registry.REGISTRY["bittensor"], target=harness))
    monkeypatch.setitem(registry.BACKENDS, "bittensor", harness)
    result = CliRunner().invoke(app, ["submit", str(job / "job.yaml"), "--policy", str(job / "untrusted.yaml"),
                                      "--wait", "--json"])
    assert result.exit_code == 1, result.output
    shown = json.loads(result.output[result.output.index("{"):])
    [attempt] = shown["attempts"]
    assert (attempt["backend"], attempt["state"]) == ("bittensor", "rejected")
    assert "replay audit failed" in attempt["reason"], attempt["reason"]
    assert [r.kind for r in _ledger_rows(shown["id"])] == ["reserve", "release"]


def test_a_trusted_fallback_never_resumes_from_an_untrusted_attempts_states(tm_home, job):
    """A miner commits every segment of a lazy run and vanishes; the fallback on the user's own machine
    starts from scratch (not from the miner's states) and ends on the honest final weights."""
    from trainmaster.broker.service import Broker
    from untrusted_backend import VanishingExecutor

    (job / "fallback.yaml").write_text(POLICY.replace("  primary: bittensor\n", "  primary: bittensor\n  fallbacks: [local]\n"))
    broker = SyncBroker(Broker(backends={"bittensor": VanishingExecutor()}))
    done = broker.wait(broker.submit(job / "job.yaml", str(job / "fallback.yaml")).id, timeout_s=240)
    assert done.state == "accepted", done.reason
    first, second = broker.store.attempts(done.id)
    assert (first.backend, first.state, second.backend) == ("bittensor", "failed", "local")
    assert any((paths.attempt_dir(done.id, 1) / "checkpoints" / "segments").iterdir())  # states were there to take
    launch = json.loads((paths.attempt_dir(done.id, 2) / "launch.json").read_text())
    assert launch["env"]["TRAINMASTER_RESUME_FROM"] == ""
    honest = broker.wait(broker.submit(job / "job.yaml").id, timeout_s=240)  # the same job, on local alone
    commitments = [json.loads((paths.job_dir(j.id) / "outputs" / "commitment.json").read_text()) for j in (done, honest)]
    assert commitments[0]["final_sha256"] == commitments[1]["final_sha256"]
    broker.close()


def test_a_ban_lasts_across_jobs_until_lifted(tm_home, job, monkeypatch):
    """A lazy miner rejected on job B is banned by hotkey and coldkey: job C is never dispatched to it, and
    `trainmaster executors ls` shows the ban and the record; once `executors unban` lifts both, job D is."""
    from typer.testing import CliRunner

    from trainmaster.backends import registry
    from trainmaster.broker.cli import app

    harness = "untrusted_backend:LazyExecutor"
    monkeypatch.setitem(registry.REGISTRY, "bittensor", dataclasses.replace(registry.REGISTRY["bittensor"], target=harness))
    monkeypatch.setitem(registry.BACKENDS, "bittensor", harness)
    hotkey = UntrustedExecutor().keypair.ss58_address

    def submit() -> dict:
        result = CliRunner().invoke(app, ["submit", str(job / "job.yaml"), "--policy", str(job / "untrusted.yaml"),
                                          "--wait", "--json"])
        assert result.exit_code == 1 and "{" in result.output, result.output
        return json.loads(result.output[result.output.index("{"):])

    b = submit()
    assert [a["state"] for a in b["attempts"]] == ["rejected"]
    listed = json.loads(CliRunner().invoke(app, ["executors", "ls", "--json"]).output)
    assert [(r["hotkey"], r["rejected"], r["accepted"]) for r in listed["executors"]] == [(hotkey, 1, 0)]
    assert {(x["kind"], x["key"], x["job_id"]) for x in listed["bans"]} == {("hotkey", hotkey, b["id"])}

    refused = CliRunner().invoke(app, ["submit", str(job / "job.yaml"), "--policy", str(job / "untrusted.yaml")])
    assert refused.exit_code == 1  # job C: the banned miner's only offer is refused at planning, nothing recorded
    assert "1 offer: its executor is banned (trainmaster executors ls)" in refused.output, refused.output

    assert CliRunner().invoke(app, ["executors", "unban", hotkey]).exit_code == 0
    assert CliRunner().invoke(app, ["executors", "unban", hotkey]).exit_code == 2  # nothing left to lift
    d = submit()
    assert [a["state"] for a in d["attempts"]] == ["rejected"]  # dispatched again (and caught again)


def test_going_silent_after_seeing_the_challenge_is_rejected_unpaid_and_banned(tm_home, job, monkeypatch):
    """The executor answers its challenge with a stream cut half-way, on every retry: through `trainmaster
    submit`, the attempt is rejected (not left unverifiable), its reservation released, its hotkey banned."""
    from typer.testing import CliRunner

    from trainmaster.backends import registry
    from trainmaster.broker.cli import app

    harness = "untrusted_backend:SilentExecutor"
    monkeypatch.setitem(registry.REGISTRY, "bittensor", dataclasses.replace(registry.REGISTRY["bittensor"], target=harness))
    monkeypatch.setitem(registry.BACKENDS, "bittensor", harness)
    monkeypatch.setattr("trainmaster.backends.retry.MAX_WAIT_S", 0.05)
    result = CliRunner().invoke(app, ["submit", str(job / "job.yaml"), "--policy", str(job / "untrusted.yaml"),
                                      "--wait", "--json"])
    assert result.exit_code == 1, result.output
    shown = json.loads(result.output[result.output.index("{"):])
    [attempt] = shown["attempts"]
    assert attempt["state"] == "rejected", attempt
    assert "did not answer its challenge" in attempt["reason"] and "stopped at" in attempt["reason"], attempt["reason"]
    assert [r.kind for r in _ledger_rows(shown["id"])] == ["reserve", "release"]
    listed = json.loads(CliRunner().invoke(app, ["executors", "ls", "--json"]).output)
    assert [b["key"] for b in listed["bans"]] == [UntrustedExecutor().keypair.ss58_address]
