"""Unauditable jobs never reach untrusted compute by accident (broker/auditability.py).

A job whose entrypoint does not train through the runtime commits to nothing: planning does not offer it
to untrusted backends (the dry run says why), unless its spec opts into outcome-only trust (an evaluator
with thresholds), whose verdict states the risk; and a run that lacks a commitment because its job never
makes one is the job's failure, never the executor's: it bans no one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from broker_support import SyncBroker
from repo_paths import ROOT
from trainmaster.broker import paths
from trainmaster.broker.auditability import UNTRUSTED_REASON, outcome_only, untrusted_refusal
from trainmaster.broker.cli import app
from trainmaster.jobs.spec import JobSpec
from trainmaster.verify.trust import NO_COMMITMENT, OUTCOME_ONLY_RISK
from untrusted_backend import UntrustedExecutor

DEMO = ROOT / "configs" / "examples" / "demo"
POLICY = "name: tao\ndefault:\n  primary: bittensor\n  fallbacks: [local]\ntao_rate:\n  usd_per_tao: 400\n"
UNTRUSTED_ONLY = "name: untrusted\ndefault:\n  primary: bittensor\n"
EVALUATE = """\
import json, os
from safetensors.torch import load_file
weights = load_file(os.environ["TRAINMASTER_EVAL_CHECKPOINT"])
print(json.dumps({"tensors": float(len(weights))}))
"""
OUTCOME_ONLY = "verification:\n  evaluator: python evaluate.py\n  thresholds:\n    tensors: 1\n"


@pytest.fixture
def demo(tmp_path) -> Path:
    job = Path(shutil.copytree(DEMO, tmp_path / "demo"))
    (tmp_path / "policy.yaml").write_text(POLICY)
    (tmp_path / "untrusted.yaml").write_text(UNTRUSTED_ONLY)
    (job / "evaluate.py").write_text(EVALUATE)
    return job


def _dry_run(job: Path, policy: Path) -> dict:
    result = CliRunner().invoke(app, ["submit", str(job / "job.yaml"), "--policy", str(policy), "--dry-run", "--json"])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout[result.stdout.index("{"):])


def test_the_shipped_demo_is_not_offered_to_miners_and_the_dry_run_says_why(tm_home, demo):
    plan = _dry_run(demo, demo.parent / "policy.yaml")
    assert plan["unavailable"]["bittensor"] == [UNTRUSTED_REASON]
    assert plan["chosen"]["backend"] == "local"  # the fallback runs it, on our own compute
    # the human dry run says it too, in its reasons
    text = CliRunner().invoke(app, ["submit", str(demo / "job.yaml"), "--policy", str(demo.parent / "policy.yaml"),
                                    "--dry-run"])
    assert "bittensor: untrusted compute is paid only for audited work" in " ".join(text.output.split())


def test_with_miners_only_the_unauditable_job_is_refused_before_anything_is_recorded(tm_home, demo):
    result = CliRunner().invoke(app, ["submit", str(demo / "job.yaml"), "--policy", str(demo.parent / "untrusted.yaml")])
    assert result.exit_code == 1, result.output
    assert "cannot be audited" in " ".join(result.output.split())
    assert not (paths.home() / "jobs").exists() or not any((paths.home() / "jobs").iterdir())


def test_a_recipe_job_and_an_outcome_only_job_are_offered_to_untrusted_backends():
    recipe = JobSpec(name="r", entrypoint="python -m trainmaster.jobs.recipes.dqn --steps 100")
    own = JobSpec(name="o", entrypoint="python train.py", recipe="train:RECIPE")
    plain = JobSpec(name="p", entrypoint="python train.py")
    opted = JobSpec(name="p", entrypoint="python train.py",
                    verification={"evaluator": "python evaluate.py", "thresholds": {"score": 0.5}})
    half = JobSpec(name="p", entrypoint="python train.py", verification={"evaluator": "python evaluate.py"})
    always = opted.model_copy(update={"verification": opted.verification.model_copy(update={"replay_audit": "always"})})
    assert [untrusted_refusal(s, backend_trusted=False) for s in (recipe, own, opted)] == [[], [], []]
    assert untrusted_refusal(plain, backend_trusted=False) == [UNTRUSTED_REASON]
    assert untrusted_refusal(half, backend_trusted=False) == [UNTRUSTED_REASON]  # an evaluator without thresholds
    assert untrusted_refusal(always, backend_trusted=False) == [UNTRUSTED_REASON]  # it asks for an audit it cannot get
    assert untrusted_refusal(plain, backend_trusted=True) == []  # our own compute runs anything
    # a policy that judges untrusted work without the audit has chosen so for every job (its verdicts say the risk)
    assert untrusted_refusal(plain, backend_trusted=False, audits_untrusted=False) == []
    assert outcome_only(opted) and not outcome_only(recipe)


def test_an_outcome_only_job_runs_on_an_untrusted_executor_and_its_verdict_states_the_risk(tm_home, demo):
    from trainmaster.broker.service import Broker

    spec = demo / "job.yaml"
    spec.write_text(spec.read_text().replace("--steps 300", "--steps 50") + OUTCOME_ONLY)
    executor = UntrustedExecutor()
    broker = SyncBroker(Broker(backends={"bittensor": executor}))
    done = broker.wait(broker.submit(spec, str(demo.parent / "untrusted.yaml")).id, timeout_s=240)
    assert done.state == "accepted", done.reason
    verdict = json.loads((paths.job_dir(done.id) / "verdict.json").read_text())
    assert "replay" not in verdict["checks"] and "outcome" in verdict["checks"]
    assert verdict["evidence"]["trust"] == {"mode": "outcome_only", "risk": OUTCOME_ONLY_RISK}
    assert verdict["evidence"]["outcome"]["metrics"]["tensors"] == 4.0  # the broker's own evaluation decided
    broker.close()


def test_a_run_whose_job_makes_no_commitment_is_the_jobs_failure_and_bans_no_one(tm_home, demo):
    """A job planned before this rule (or under a policy that audits everything) reaches an untrusted
    executor and comes back, as it must, without a commitment: the attempt fails as its script would."""
    from trainmaster.broker.service import Broker
    from trainmaster.verify.pipeline import Attempt, verify_attempt

    spec = demo / "job.yaml"
    spec.write_text(spec.read_text().replace("--steps 300", "--steps 50"))
    outputs = demo.parent / "outputs"
    outputs.mkdir()
    (outputs / "model.safetensors").write_bytes(b"")  # what the run wrote; never loaded before the integrity check
    from trainmaster.jobs.spec import load_spec

    attempt = Attempt(job_id="j", attempt_id="a", outputs=outputs, bundle_sha256="0" * 64, spec=load_spec(spec).spec,
                      trusted=False, hotkey="5Fake")
    verdict = verify_attempt(attempt, checks={"integrity", "replay"}, db_path=tm_home / "v.db", write_verdict=False)
    assert verdict.outcome == "cannot_verify" and verdict.reasons == [NO_COMMITMENT]
    assert verdict.evidence["job_fault"] == NO_COMMITMENT
    # through the broker: an executor handed such a job is not banned, and the job fails as its script would
    executor = UntrustedExecutor()
    broker = SyncBroker(Broker(backends={"bittensor": executor}))
    from trainmaster.broker import auditability

    original = auditability.untrusted_refusal
    try:
        auditability.untrusted_refusal = lambda *args, **kwargs: []  # as a broker before this rule planned it
        done = broker.wait(broker.submit(spec, str(demo.parent / "untrusted.yaml")).id, timeout_s=240)
    finally:
        auditability.untrusted_refusal = original
    assert done.state == "failed", done.reason
    assert NO_COMMITMENT in done.reason
    [ran] = broker.store.attempts(done.id)
    assert ran.state == "failed"
    result = CliRunner().invoke(app, ["executors", "ls", "--json"])
    listed = json.loads(result.stdout)
    assert listed["bans"] == []  # the executor ran the job as asked: nobody is banned
    [record] = listed["executors"]
    assert record["hotkey"] == executor.keypair.ss58_address and record["rejected"] == 0
    broker.close()


def test_through_the_cli_with_a_real_miner_the_plain_job_is_refused_and_the_opted_in_one_is_paid_on_outcome(
        tmp_path, tm_home, demo):
    """The user's path end to end: `offers`, `submit --dry-run` and `submit --wait` with backends.yaml listing a real
    `trainmaster miner serve` process. The shipped demo is never offered to it (not even asked for a quote: its only
    answer is the refusal); opted into outcome-only trust, the same job runs on the miner, is accepted on the
    broker's own evaluation alone, and `verify show` warns of the risk."""
    from miner_support import MinerProcess, make_wallet, shown, tm

    wallets = tmp_path / "wallets"
    make_wallet(wallets, "broker")
    miner = MinerProcess(tmp_path / "miner", make_wallet(wallets, "miner"),
                         config={"prices": {"rao_per_gpu_hour": {"cpu": 2_000_000_000}}, "default_hours": 0.25}).start()
    try:
        (tm_home / "config").mkdir(parents=True, exist_ok=True)
        (tm_home / "config" / "backends.yaml").write_text(
            f"bittensor:\n  wallet:\n    name: broker\n    path: {wallets}\n  quote_timeout_s: 5\n"
            f"  miners:\n    - hotkey: {miner.hotkey}\n      url: {miner.url}\n")
        spec, policy = demo / "job.yaml", demo.parent / "miners.yaml"
        policy.write_text(UNTRUSTED_ONLY + "tao_rate:\n  usd_per_tao: 400\n")
        spec.write_text(spec.read_text().replace("--steps 300", "--steps 50"))
        offered = shown(tm("offers", str(spec), "--policy", str(policy), "--json"))
        assert offered["unavailable"]["bittensor"] == [UNTRUSTED_REASON] and not offered["considered"]
        refused = tm("submit", str(spec), "--policy", str(policy), "--wait", "--json")
        assert refused.returncode == 1 and "cannot be audited" in " ".join((refused.stdout + refused.stderr).split())
        assert "Traceback" not in refused.stdout + refused.stderr

        spec.write_text(spec.read_text() + OUTCOME_ONLY)
        offered = shown(tm("offers", str(spec), "--policy", str(policy), "--json"))
        assert [r["offer"]["instance"] for r in offered["considered"]] == [miner.hotkey], offered
        done = tm("submit", str(spec), "--policy", str(policy), "--wait", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        job = shown(done)
        assert job["state"] == "accepted" and [a["backend"] for a in job["attempts"]] == ["bittensor"], job
        verdict = json.loads((tm_home / "jobs" / job["id"] / "verdict.json").read_text())
        assert "replay" not in verdict["checks"] and verdict["evidence"]["trust"]["risk"] == OUTCOME_ONLY_RISK
        told = tm("verify", "show", job["id"])
        assert told.returncode == 0 and f"warning: {OUTCOME_ONLY_RISK}" in " ".join(told.stdout.split()), told.stdout
    finally:
        miner.stop()
