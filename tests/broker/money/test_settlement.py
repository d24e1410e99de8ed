"""Paying and settling with untrusted executors, end to end (tests/untrusted_backend.py): the price agreed at
dispatch whatever time the executor reports, only the outputs its commitment binds kept, and the payment
and the conclusion delivered exactly once across a kill -9 between every step."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from background_support import polled
from child_hooks import hook_env
from trainmaster.broker import paths
from untrusted_backend import EXECUTOR_DIR, RAO_PER_HOUR, USD_PER_TAO_MICRO, UntrustedExecutor, told_at
from repo_paths import TESTS

pytestmark = pytest.mark.slow

# 40 AdamW steps of a small transformer, k = 10: 4 segments, all audited; planned for 0.001 h of work (what is paid
# and concluded does not depend on the run's length: the short run of tests/tiny_lm_job.py, each step costing CPU in
# the run and the audit's replay; the runtime's self-check is off, as in tests/tiny_lm_job.py, as it proves nothing here)
JOB = """\
name: lm
entrypoint: python -m trainmaster.jobs.recipes.tiny_lm --steps 40 --d-model 32 --layers 1 --seq-len 16 --batch-size 8 --warmup 10
seed: 3
estimated_hours: 0.001
checkpoint:
  segment_steps: 10
  selfcheck: false
verification:
  evaluator: python evaluate.py
  thresholds:
    score: 0.5
"""
EVALUATE = 'import json\nprint(json.dumps({"score": 0.75}))\n'
POLICY = """\
name: untrusted
default:
  primary: bittensor
verification:
  tau: 0.01
"""


@pytest.fixture
def job(tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "job.yaml").write_text(JOB)
    (folder / "evaluate.py").write_text(EVALUATE)
    (tmp_path / "untrusted.yaml").write_text(POLICY)
    return folder


def _use(monkeypatch, executor: str) -> None:
    """Point the registry's bittensor entry at a harness executor (what `trainmaster submit` dispatches to)."""
    from trainmaster.backends import registry

    harness = f"untrusted_backend:{executor}"
    monkeypatch.setitem(registry.REGISTRY, "bittensor", dataclasses.replace(registry.REGISTRY["bittensor"], target=harness))
    monkeypatch.setitem(registry.BACKENDS, "bittensor", harness)
    for name, value in hook_env(f"backend=bittensor@{harness}").items():  # and in the background pass a read starts
        monkeypatch.setenv(name, value)


def _submit(job: Path) -> dict:
    from trainmaster.broker.cli import app

    result = CliRunner().invoke(app, ["submit", str(job / "job.yaml"), "--policy", str(job.parent / "untrusted.yaml"),
                                      "--wait", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output[result.output.index("{"):])


def _ledger_rows(job_id: str):
    from trainmaster.wallet.ledger import Ledger

    with Ledger(paths.state_db()) as ledger:
        return ledger.entries(job_id=job_id)


def test_an_idling_executor_is_paid_the_agreed_price_like_an_honest_one(tm_home, job, monkeypatch):
    """The same job through `trainmaster submit`, once on an honest executor and once on one that idles before
    it reports the run done and bills that time: both accepted, both paid exactly the price agreed at dispatch
    (2 TAO/h × the planned hours), never more than the reservation."""
    _use(monkeypatch, "UntrustedExecutor")
    honest = _submit(job)
    _use(monkeypatch, "IdlingExecutor")
    idle = _submit(job)
    charges = {}
    for shown in (honest, idle):
        assert shown["state"] == "accepted"
        reserve, charge = _ledger_rows(shown["id"])
        assert (reserve.kind, charge.kind) == ("reserve", "charge")
        assert charge.rao == reserve.rao == round(RAO_PER_HOUR * reserve.detail["hours"]) > 0
        assert charge.micro_usd == charge.rao * USD_PER_TAO_MICRO // 10**9 <= reserve.micro_usd
        [attempt] = shown["attempts"]
        assert attempt["billable_seconds"] == pytest.approx(reserve.detail["hours"] * 3600)  # not what it reported
        charges[shown["id"]] = (charge.rao, charge.micro_usd)
    assert charges[honest["id"]] == charges[idle["id"]]


def test_outputs_its_commitment_does_not_bind_are_dropped(tm_home, job, monkeypatch):
    """An executor returns another model and forged result.json and metrics.jsonl beside its honest run: through
    `trainmaster submit` and `status`, only the committed files are kept, the rest listed as dropped, and the
    metrics are the broker's own evaluator's."""
    from trainmaster.broker.cli import app

    _use(monkeypatch, "ForgingExecutor")
    shown = _submit(job)
    assert shown["state"] == "accepted"
    [attempt] = shown["attempts"]
    assert [f["path"] for f in attempt["outputs"]] == ["commitment.json", "model.safetensors"]
    assert attempt["dropped"] == ["metrics.jsonl", "model_best.safetensors", "result.json"]
    assert attempt["metrics"] == {"score": 0.75}  # the evaluator's, not the forged result.json's 0.99
    outputs = Path(shown["outputs_dir"])
    assert sorted(p.name for p in outputs.iterdir()) == ["commitment.json", "model.safetensors"]
    verdict = json.loads((paths.job_dir(shown["id"]) / "verdict.json").read_text())
    assert verdict["evidence"]["integrity"]["dropped"] == attempt["dropped"]
    assert verdict["evidence"]["outcome"]["source"] != "result.json"
    status = CliRunner().invoke(app, ["status", shown["id"]], env={"COLUMNS": "200"})
    assert status.exit_code == 0, status.output
    assert "dropped outputs" in status.output and "model_best.safetensors" in status.output


def _driver(point: str, job: Path, state: Path) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(TESTS / "settle_driver.py"), point, str(job / "job.yaml"),
                           str(job.parent / "untrusted.yaml"), str(state)], env=env, timeout=300).returncode


def test_payment_and_conclusion_happen_exactly_once_across_kill_9_at_every_step(tm_home, job, tmp_path):
    """A broker process that dies right after the verdict is stored, then one that dies after the charge and
    its payment are recorded, one after the transfer is made, one after the executor acknowledged its
    conclusion, and a last one: one transfer, one charge, one verdict, the conclusion delivered and its
    countersignature stored; the executor checked the revealed secret against the digest published at dispatch."""
    from trainmaster.broker.money.settlement import Settlement
    from trainmaster.broker.store import Store
    from trainmaster.verify.records import VerdictStore
    from trainmaster.wallet.keys import signed_by
    from trainmaster.wallet.payments import ConclusionChannel, Payments

    state = tmp_path / "driver"
    state.mkdir()
    for point in ("verdict", "charge", "transfer", "conclude"):
        assert _driver(point, job, state) == 9, point  # it died where it was told to
    assert _driver("none", job, state) == 0
    job_id = (state / "job_id").read_text()
    store = Store(paths.state_db())
    [attempt] = store.attempts(job_id)
    assert (store.job(job_id).state, attempt.state) == ("accepted", "accepted")

    reserve, charge = _ledger_rows(job_id)
    assert (reserve.kind, charge.kind) == ("reserve", "charge")
    transfers = [json.loads(line) for line in (state / "transfers.jsonl").read_text().splitlines()]
    [payment] = Payments(store.db).all(job_id=job_id)
    payee = attempt.executor_coldkey or attempt.executor_hotkey
    assert transfers == [{"key": f"pay:charge:{attempt.id}", "payee": payee, "rao": charge.rao,
                          "transfer": "tx-1"}]
    assert (payment.key, payment.rao, payment.transfer) == (f"pay:charge:{attempt.id}", charge.rao, "tx-1")
    verdicts = VerdictStore(paths.state_db())
    assert [v.outcome for v in verdicts.history(job_id)] == ["accepted"]  # not verified again after the crash
    verdicts.close()

    told = told_at(paths.attempt_dir(job_id, 1))
    assert len(told) == 2  # the first acknowledgement died with the broker: told again, answered the same
    assert told[0]["conclusion"] == told[1]["conclusion"] and told[0]["countersignature"] == told[1]["countersignature"]
    conclusion = told[-1]["conclusion"]
    assert (conclusion["verdict"], conclusion["amount_rao"]) == ("accepted", charge.rao)
    assert told[-1]["secret_matches_published"] and told[-1]["receipt_names_published"]
    assert told[-1]["broker_signature_valid"]
    published = (paths.attempt_dir(job_id, 1) / EXECUTOR_DIR / "published").read_text()
    assert hashlib.sha256(bytes.fromhex(conclusion["challenge_secret"])).hexdigest() == published
    receipt = json.loads(conclusion["receipt"])
    assert (receipt["payment"], receipt["transfer"], receipt["amount_rao"]) == (payment.key, "tx-1", charge.rao)

    stored = Settlement(store.db, store.path, key_path=paths.home() / "keys" / "broker.key",
                        sender=ConclusionChannel()).receipt(attempt.id)
    assert stored.receipt == conclusion["receipt"] and stored.countersignature == told[-1]["countersignature"]
    assert signed_by(stored.receipt.encode(), stored.countersignature, attempt.executor_hotkey)
    assert oct((paths.home() / "keys" / "broker.key").stat().st_mode & 0o777) == "0o600"
    store.close()


def test_a_rejected_executor_is_told_its_verdict_and_secret_and_paid_nothing(tm_home, job, monkeypatch):
    """A lazy executor caught by the audit is concluded too: verdict rejected, 0 rao, the secret it can check."""
    from trainmaster.broker.cli import app
    from trainmaster.broker.store import Store
    from trainmaster.wallet.payments import Payments

    _use(monkeypatch, "LazyExecutor")
    result = CliRunner().invoke(app, ["submit", str(job / "job.yaml"), "--policy", str(job.parent / "untrusted.yaml"),
                                      "--wait", "--json"])
    assert result.exit_code == 1, result.output
    shown = json.loads(result.output[result.output.index("{"):])
    [attempt] = shown["attempts"]
    assert attempt["state"] == "rejected"
    [told] = told_at(paths.attempt_dir(shown["id"], 1))
    assert (told["conclusion"]["verdict"], told["conclusion"]["amount_rao"]) == ("rejected", 0)
    assert told["secret_matches_published"] and told["broker_signature_valid"]
    store = Store(paths.state_db())
    assert Payments(store.db).all(job_id=shown["id"]) == []
    assert [r.kind for r in _ledger_rows(shown["id"])] == ["reserve", "release"]
    store.close()


def test_an_executor_that_never_acknowledges_leaves_the_conclusion_to_send_again(tm_home, job, monkeypatch):
    """A conclusion the executor refuses is recorded as an error on the job; a read sends nothing, and the background
    pass the next read starts sends the same one."""
    from trainmaster.backends.base import ExecutorFault
    from trainmaster.broker.cli import app

    _use(monkeypatch, "UntrustedExecutor")
    original = UntrustedExecutor.conclude

    async def refusing(self, handle, conclusion):
        raise ExecutorFault("not now")

    monkeypatch.setattr(UntrustedExecutor, "conclude", refusing)
    shown = _submit(job)
    assert shown["state"] == "accepted" and told_at(paths.attempt_dir(shown["id"], 1)) == []
    no_pass = {"TRAINMASTER_BACKGROUND_S": "0"}
    events = json.loads(CliRunner().invoke(app, ["status", shown["id"], "--json"], env=no_pass).output)["events"]
    assert any("settling attempt 1 with its executor: not now" in (e["detail"] or {}).get("message", "") for e in events)
    assert told_at(paths.attempt_dir(shown["id"], 1)) == []  # a read sends nothing itself
    monkeypatch.setattr(UntrustedExecutor, "conclude", original)

    def read() -> list[dict]:
        assert CliRunner().invoke(app, ["status", shown["id"]]).exit_code == 0  # it starts the background pass
        return told_at(paths.attempt_dir(shown["id"], 1))

    [told] = polled(read, lambda told: told != [], timeout=60)  # the pass settles what is pending
    assert told["conclusion"]["verdict"] == "accepted" and told["secret_matches_published"]
