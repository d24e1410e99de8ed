"""`trainmaster verify show`: stored verdicts by job id, local checks of an outputs directory, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import typer
from safetensors.torch import save_file
from typer.testing import CliRunner

from trainmaster.broker.cli.verify import register
from trainmaster.verify.records import VerdictStore
from trainmaster.verify.verdict import Verdict


@pytest.fixture
def app() -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def other() -> None:  # a second command, as in the real app, so `verify` stays a group
        pass

    register(app)
    return app


def invoke(app, *args: str):
    return CliRunner().invoke(app, ["verify", "show", *args])


@pytest.fixture
def stored(tm_home):
    store = VerdictStore(tm_home / "state.db")
    store.record(Verdict(outcome="accepted", checks=["integrity"], job_id="train-aaa111", attempt_id="a1"))
    store.record(Verdict(outcome="rejected", reasons=["signature is not valid"], checks=["integrity"], job_id="train-bbb222"))
    store.record(Verdict(outcome="cannot_verify", reasons=["evaluator crashed"], job_id="train-ccc333"))
    store.close()


@pytest.mark.parametrize("job, code, word", [("train-aaa111", 0, "ACCEPTED"), ("train-bbb222", 1, "REJECTED"),
                                             ("train-ccc333", 2, "CANNOT VERIFY"), ("train-bbb", 1, "REJECTED")])
def test_show_stored_verdict(app, stored, job, code, word):
    result = invoke(app, job)
    assert result.exit_code == code, result.output
    assert word in result.output


def test_show_json(app, stored):
    result = invoke(app, "train-bbb222", "--json")
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["outcome"] == "rejected" and data["reasons"] == ["signature is not valid"]


def test_unknown_job_is_exit_2(app, stored):
    result = invoke(app, "nope")
    assert result.exit_code == 2 and "no verdict" in result.output


def test_no_database_is_exit_2(app, tm_home):
    result = invoke(app, "train-aaa111")
    assert result.exit_code == 2 and "no verdicts yet" in result.output


def test_directory_of_safe_outputs_is_accepted(app, tmp_path):
    save_file({"w": torch.ones(3)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    result = invoke(app, str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["checks"] == ["integrity", "safety"]


class Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def test_directory_with_a_pickle_is_rejected(app, tmp_path):
    marker = tmp_path / "marker"
    torch.save({"w": torch.ones(1), "evil": Payload(marker)}, tmp_path / "model.pt")
    result = invoke(app, str(tmp_path))
    assert result.exit_code == 1 and "model.pt is a torch.save archive" in result.output
    assert "refused from untrusted compute" in result.output
    assert not marker.exists()


def test_directory_with_nan_weights_is_rejected(app, tmp_path):
    save_file({"w": torch.tensor([float("inf")])}, str(tmp_path / "model.safetensors"))
    result = invoke(app, str(tmp_path))
    assert result.exit_code == 1 and "holds ±Inf" in result.output


def test_directory_with_spec_runs_the_outcome_check_of_that_spec(app, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("")
    (code / "evaluate.py").write_text("print('{\"score\": 0.2}')\n")
    (code / "job.yaml").write_text(textwrap.dedent("""\
        name: t
        entrypoint: python train.py
        verification:
          evaluator: python evaluate.py
          thresholds: {score: 0.5}
    """))
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    save_file({"w": torch.ones(3)}, str(outputs / "model.safetensors"))
    result = invoke(app, str(outputs), "--spec", str(code / "job.yaml"), "--json")
    assert result.exit_code == 1, result.output
    verdict = json.loads(result.output)
    assert verdict["checks"] == ["integrity", "safety", "outcome"]
    assert "score = 0.2 is below the threshold 0.5" in verdict["reasons"][0]


def test_verify_job_id_without_show_is_the_same_as_show(app, stored):
    from typer.testing import CliRunner

    runner = CliRunner()
    short = runner.invoke(app, ["verify", "train-bbb222", "--json"])
    long = runner.invoke(app, ["verify", "show", "train-bbb222", "--json"])
    assert short.exit_code == long.exit_code == 1
    assert short.output == long.output
    assert "calibrate" in runner.invoke(app, ["verify", "--help"]).output


def test_module_imports_only_typer():
    code = (
        "import sys; import trainmaster.broker.cli.verify; "
        "heavy = [m for m in ('torch', 'safetensors', 'bittensor', 'trainmaster.verify.pipeline', 'pydantic') if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_show_says_where_the_audit_replayed_and_what_outcome_only_trust_risks(app, tm_home):
    from trainmaster.verify.trust import OUTCOME_ONLY_RISK, outcome_only_evidence

    store = VerdictStore(tm_home / "state.db")
    replay = {"device": "cpu", "executor_device": "cuda", "tau_source": "calibration", "calibration_pair": "cpu→cpu",
              "calibration_note": "the cpu→cpu calibration stands in for cuda→cpu (docs/audit.md, Devices)"}
    store.record(Verdict(outcome="accepted", checks=["replay"], evidence={"replay": replay}, job_id="gpu-aaa111"))
    store.record(Verdict(outcome="accepted", checks=["outcome"], evidence={"trust": outcome_only_evidence()},
                         job_id="plain-bbb222"))
    store.close()
    shown = " ".join(invoke(app, "gpu-aaa111").output.split())
    assert ("replayed on cpu (executor trained on cuda; τ from the cpu→cpu calibration); the cpu→cpu calibration "
            "stands in for cuda→cpu") in shown
    assert f"warning: {OUTCOME_ONLY_RISK}" in " ".join(invoke(app, "plain-bbb222").output.split())
