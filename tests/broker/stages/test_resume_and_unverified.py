"""Resume after a crash (by hand or by the policy's retries) ends where an uninterrupted run ends, and an
attempt whose checks could not run waits, unpaid and unblocked, for `trainmaster verify JOB --again`."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from typer.testing import CliRunner

from trainmaster.broker import paths
from trainmaster.broker.cli import app

pytestmark = pytest.mark.slow

JOB = """\
name: lm
entrypoint: python -m trainmaster.jobs.recipes.tiny_lm --steps 80 --d-model 32 --layers 1 --seq-len 16 --batch-size 8 --warmup 10
seed: 5
checkpoint:
  segment_steps: 10
"""
"""8 segments of 10 steps, killed after the third: what a resume proves does not depend on the steps' count (each
costs CPU in the run, its resume and the runtime's self-check)."""


def _commitment(job_id: str) -> dict:
    return json.loads((paths.job_dir(job_id) / "outputs" / "commitment.json").read_text())


def _kill_after_segments(job_id: str, segments: int, n: int = 1, timeout: float = 120.0) -> None:
    """kill -9 the attempt's whole process group once `segments` segments are on disk."""
    workdir = paths.attempt_dir(job_id, n)
    deadline = time.time() + timeout
    while len(list((workdir / "checkpoints" / "segments").glob("*/manifest.json"))) < segments:
        assert time.time() < deadline and not (workdir / "exit.json").exists(), "the run ended before the kill"
        time.sleep(0.05)
    os.killpg(json.loads((workdir / "supervisor.json").read_text())["pid"], signal.SIGKILL)


def _policy(tmp_path, retries: int):
    path = tmp_path / f"retries{retries}.yaml"
    path.write_text(f"name: r{retries}\ndefault:\n  primary: local\n  retries: {retries}\n")
    return str(path)


def test_resume_after_kill_9_ends_on_the_uninterrupted_final_hash(broker, tmp_path):
    (tmp_path / "job.yaml").write_text(JOB)
    whole = broker.wait(broker.submit(tmp_path / "job.yaml").id, timeout_s=240)
    assert whole.state == "accepted", whole.reason

    # by hand: killed, failed, then `trainmaster resume`
    job = broker.submit(tmp_path / "job.yaml")
    _kill_after_segments(job.id, 3)
    failed = broker.wait(job.id, timeout_s=60)
    assert failed.state == "failed" and "died without finishing" in failed.reason
    resumed = CliRunner().invoke(app, ["resume", job.id, "--wait", "--json"])
    assert resumed.exit_code == 0, resumed.output
    shown = json.loads(resumed.output[resumed.output.index("{"):])
    assert shown["state"] == "accepted" and [a["state"] for a in shown["attempts"]] == ["failed", "accepted"]
    launch = json.loads((paths.attempt_dir(job.id, 2) / "launch.json").read_text())
    assert launch["env"]["TRAINMASTER_RESUME_FROM"] == str(paths.attempt_dir(job.id, 1) / "checkpoints")
    assert _commitment(job.id)["final_sha256"] == _commitment(whole.id)["final_sha256"]
    assert _commitment(job.id)["n"] == _commitment(whole.id)["n"] == 8

    # by policy: `retries: 1` tries the same offer again at once, resuming, with no blocked offer
    job = broker.submit(tmp_path / "job.yaml", _policy(tmp_path, 1))
    _kill_after_segments(job.id, 3)
    done = broker.wait(job.id, timeout_s=240)
    assert done.state == "accepted", done.reason
    first, second = broker.store.attempts(done.id)
    assert first.state == "failed" and second.state == "accepted" and first.offer_json == second.offer_json
    assert [e.kind for e in broker.store.events(done.id)].count("retry") == 1
    assert _commitment(done.id)["final_sha256"] == _commitment(whole.id)["final_sha256"]


def test_resume_refuses_a_job_that_is_not_failed_or_cancelled(broker, job_factory):
    job = broker.wait(broker.submit(job_factory("print(1)\n", "outputs:\n  optional: true\n")).id, timeout_s=60)
    assert job.state == "accepted", job.reason
    out = CliRunner().invoke(app, ["resume", job.id])
    assert out.exit_code == 2 and "only a failed or cancelled job can be resumed" in out.output


EVALUATOR = """\
import json, os, pathlib, sys
if not pathlib.Path(os.environ["METRICS_READY"]).exists():
    sys.exit("ModuleNotFoundError: No module named 'fancy_metrics'")
print(json.dumps({"score": 1.0}))
"""
TRAIN = """\
import os, pathlib, torch
from safetensors.torch import save_file
save_file({"w": torch.ones(3)}, str(pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"], "model.safetensors")))
"""


def test_an_attempt_that_cannot_be_verified_waits_unpaid_then_verify_again_accepts_it(broker, job_factory, tmp_path,
                                                                                     monkeypatch):
    from trainmaster.wallet.ledger import Ledger

    ready = tmp_path / "ready"
    spec = job_factory(TRAIN, "verification:\n  evaluator: python eval.py\n  thresholds:\n    score: 0.5\n"
                              f"env:\n  METRICS_READY: {ready}\n")  # the evaluator inherits only the spec's env
    (spec.parent / "eval.py").write_text(EVALUATOR)
    job = broker.wait(broker.submit(spec).id, timeout_s=60)
    assert job.state == "unverified", job.reason
    [attempt] = broker.store.attempts(job.id)
    assert attempt.state == "unverified" and "fancy_metrics" in attempt.reason
    with Ledger(paths.state_db()) as ledger:
        assert [e.kind for e in ledger.entries() if e.job_id == job.id] == ["reserve"]  # nothing paid, nothing released
    listed = CliRunner().invoke(app, ["ls", "--json"])
    assert [j["state"] for j in json.loads(listed.output)] == ["unverified"]  # it stays where it is

    ready.touch()  # the user installs what was missing
    again = CliRunner().invoke(app, ["verify", job.id, "--again", "--json"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["outcome"] == "accepted"
    assert broker.store.job(job.id).state == "accepted"
    with Ledger(paths.state_db()) as ledger:
        assert [e.kind for e in ledger.entries() if e.job_id == job.id] == ["reserve", "charge"]
    nothing = CliRunner().invoke(app, ["verify", job.id, "--again"])
    assert nothing.exit_code == 2 and "no attempt waiting" in nothing.output
