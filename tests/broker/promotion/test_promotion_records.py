"""Promotion without a registry server: `registry.yaml` validated with file:line errors; every accepted job's
lineage recorded (state `local` with no registry); the gate's decisions; `models` commands that need a registry
say so; `models ls` imports neither mlflow nor the broker service."""

from __future__ import annotations

import json

import pytest
from import_probe import imported
from typer.testing import CliRunner

from trainmaster.broker.cli import app
from trainmaster.broker.promotion.config import load_registry
from trainmaster.broker.promotion.gate import gate_failures
from trainmaster.jobs.yamlfile import FileError

MAKE_MODEL = """\
import json, os, pathlib, struct
out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
(out / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<f", 1.0))
(out / "result.json").write_text('{"score": 0.99, "reward": 3}')
"""
SPEC = "verification:\n  evaluator: python evaluate.py\n  thresholds:\n    score: 0.5\n"


def write_registry(home, text: str) -> None:
    (home / "config").mkdir(parents=True, exist_ok=True)
    (home / "config" / "registry.yaml").write_text(text)


def test_no_registry_file_or_only_comments_means_no_registry(tm_home):
    assert load_registry() is None
    write_registry(tm_home, "# mlflow:\n#   tracking_uri: http://127.0.0.1:5000\n")
    assert load_registry() is None


def test_registry_settings_are_read_with_the_model_name_per_job(tm_home):
    write_registry(tm_home, "mlflow:\n  tracking_uri: http://127.0.0.1:5000\n  models:\n    nightly: agents\n")
    settings = load_registry()
    assert (settings.model_name("nightly"), settings.model_name("other")) == ("agents", "other")


@pytest.mark.parametrize(("text", "line", "words"), [
    ("mlflow:\n  tracking_uri: http://x\n  trackinguri: http://y\n", 3, "trackinguri"),
    ("mlflow:\n  tracking_uri: http://x\n  retries: -1\n", 3, "retries"),
    ("mlflow:\n  models: {a: b}\n", 2, "tracking_uri"),
    ("registry:\n  tracking_uri: http://x\n", 1, "registry"),
])
def test_an_invalid_registry_file_is_named_with_its_line(tm_home, text, line, words):
    write_registry(tm_home, text)
    with pytest.raises(FileError) as caught:
        load_registry()
    assert f"registry.yaml:{line}:" in str(caught.value) and words in str(caught.value), str(caught.value)


def test_the_gate_applies_the_minimums_and_the_production_floor():
    assert gate_failures({"score": 0.9}, {"score": 0.5}, None) == []
    assert gate_failures({"score": 0.4}, {"score": 0.5}, None) == ["score = 0.4 is below the threshold 0.5"]
    assert gate_failures({"score": 0.86}, {"score": 0.5}, {"score": 0.95}, "1") == []  # ≥ 0.855
    [why] = gate_failures({"score": 0.85}, {"score": 0.5}, {"score": 0.95}, "1")
    assert why.startswith("against production version 1: score = 0.85 regressed below 90%"), why
    assert gate_failures({"loss": 1.0}, {}, {"loss": 0.1}, "1") == []  # only thresholded metrics are compared
    [missing] = gate_failures({}, {"score": 0.5}, None)
    assert "'score' is not among the reported metrics" in missing


def test_without_a_registry_every_accepted_job_is_recorded_with_its_lineage(tm_home, job_factory):
    spec = job_factory(MAKE_MODEL, SPEC, name="plain")
    (spec.parent / "evaluate.py").write_text('import json\nprint(json.dumps({"score": 0.7}))\n')
    result = CliRunner().invoke(app, ["submit", str(spec), "--wait", "--json"], env={"COLUMNS": "200"})
    job = json.loads(result.output[result.output.index("{"):])
    assert job["state"] == "accepted", job
    listed = CliRunner().invoke(app, ["models", "ls", "--json"])
    [row] = json.loads(listed.output)
    assert (row["job_id"], row["state"], row["model"], row["version"]) == (job["id"], "local", None, None)
    assert row["metrics"] == {"score": 0.7}  # measured by the outcome check, not the run's own result.json
    assert row["bundle_sha256"] == job["bundle_sha256"] and len(row["spec_sha256"]) == 64
    from trainmaster.wallet.ledger import Ledger

    with Ledger(tm_home / "state.db") as ledger:
        charged = [e.micro_usd for e in ledger.entries(job_id=job["id"]) if e.kind == "charge"]
    assert row["verdict_id"] is not None and charged and row["cost_micro_usd"] == sum(charged)
    refused = CliRunner().invoke(app, ["models", "promote", job["id"]])
    assert refused.exit_code == 1 and "no model registry is configured" in refused.output, refused.output


def test_models_ls_imports_neither_mlflow_nor_the_broker_service(tm_home):
    loaded, out = imported(["models", "ls", "--json"], ["mlflow", "trainmaster.broker.service", "asyncio"])
    assert loaded == [] and json.loads(out) == []


def test_a_rollback_with_nothing_to_go_back_to_says_so(tm_home):
    write_registry(tm_home, "mlflow:\n  tracking_uri: http://127.0.0.1:9\n")  # never called: refused before
    refused = CliRunner().invoke(app, ["models", "rollback"])
    assert refused.exit_code == 1 and "no model has been registered yet" in refused.output, refused.output
