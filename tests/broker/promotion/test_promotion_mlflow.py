"""Promotion into a real MLflow tracking server (SQLite backend, started once for the module): accepted jobs are
registered as versions tagged with their lineage; the `production` alias moves only when the gate (the outcome
check against production's metrics) passes; rollback; a registry down at accept time leaves the promotion
pending until a later pass (the background pass a read starts); a restart half-way registers nothing twice; `models ls` through the CLI."""

from __future__ import annotations

import json
import time

import pytest
from cli_run import tm
from typer.testing import CliRunner

import mlflow_server
from trainmaster.broker.cli import app

pytestmark = pytest.mark.slow

MAKE_MODEL = """\
import json, os, pathlib, struct
out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
(out / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<f", 1.0))
"""
SPEC = "verification:\n  evaluator: python evaluate.py\n  thresholds:\n    score: 0.5\n"


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    process, uri = mlflow_server.start(tmp_path_factory.mktemp("mlflow"))
    yield uri
    mlflow_server.stop(process)


def configure(home, uri: str, models: dict[str, str] | None = None) -> None:
    (home / "config").mkdir(parents=True, exist_ok=True)
    lines = ["mlflow:", f"  tracking_uri: {uri}", "  timeout_s: 5", "  retries: 0"]
    lines += ["  models:"] + [f"    {job}: {model}" for job, model in (models or {}).items()] if models else []
    (home / "config" / "registry.yaml").write_text("\n".join(lines) + "\n")


def submit(spec, score: float) -> dict:
    (spec.parent / "evaluate.py").write_text(f'import json\nprint(json.dumps({{"score": {score}}}))\n')
    result = CliRunner().invoke(app, ["submit", str(spec), "--wait", "--json"], env={"COLUMNS": "200"})
    job = json.loads(result.output[result.output.index("{"):])
    assert job["state"] == "accepted", job
    return job


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})


def client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(uri)


def production(uri: str, model: str) -> str | None:
    return client(uri).get_registered_model(model).aliases.get("production")


def promotion(home, job_id: str):
    from trainmaster.broker.promotion.records import PromotionStore

    records = PromotionStore(home / "state.db")
    try:
        return records.get(job_id)
    finally:
        records.close()


def test_versions_are_registered_with_lineage_and_the_alias_moves_only_through_the_gate(tm_home, job_factory, tracking):
    configure(tm_home, tracking, {"nightly": "agents"})
    spec = job_factory(MAKE_MODEL, SPEC, name="nightly")
    first = submit(spec, 0.95)  # no production yet: the minimum 0.5 alone
    versions = client(tracking).search_model_versions("name = 'agents'")
    assert [v.version for v in versions] == ["1"]
    tags = versions[0].tags
    assert tags["trainmaster.job_id"] == first["id"]
    assert tags["trainmaster.bundle_sha256"] == first["bundle_sha256"]
    assert tags["trainmaster.verdict"] == "accepted" and tags["trainmaster.verdict_id"].isdigit()
    assert len(tags["trainmaster.spec_sha256"]) == 64 and tags["trainmaster.job_name"] == "nightly"
    run = client(tracking).get_run(versions[0].run_id)
    assert run.data.metrics == {"score": 0.95}
    assert "model/model.safetensors" in [f.path for f in client(tracking).list_artifacts(run.info.run_id, "model")]
    assert production(tracking, "agents") == "1"

    submit(spec, 0.86)  # ≥ 0.90 × 0.95 = 0.855: passes, production moves
    assert production(tracking, "agents") == "2"

    rolled = invoke("models", "rollback", "agents")
    assert rolled.exit_code == 0, rolled.output
    assert production(tracking, "agents") == "1"

    # the broker's own predecessor is the newest accepted run (0.86: 0.80 ≥ 0.774 is accepted), but production
    # is version 1 again (0.95): 0.80 < 0.855 fails the gate, so version 3 is registered and production stays
    worse = submit(spec, 0.80)
    assert production(tracking, "agents") == "1"
    record = promotion(tm_home, worse["id"])
    assert (record.version, record.state, record.gate) == ("3", "done", "failed")
    assert "against production version 1: score = 0.8 regressed below 90%" in record.gate_reasons[0], record.gate_reasons

    submit(spec, 0.97)
    assert production(tracking, "agents") == "4"

    listed = tm("models", "ls", "--json", home=tm_home)
    assert listed.returncode == 0, listed.stderr
    rows = {row["version"]: row for row in json.loads(listed.stdout)}
    assert sorted(rows) == ["1", "2", "3", "4"]
    assert [v for v, row in rows.items() if row["production"]] == ["4"]
    assert rows["3"]["gate"] == "failed" and rows["1"]["metrics"] == {"score": 0.95}
    table = tm("models", "ls", home=tm_home)
    assert "4 (production)" in table.stdout and "regressed" in table.stdout, table.stdout

    by_hand = invoke("models", "promote", worse["id"])
    assert by_hand.exit_code == 0, by_hand.output
    assert production(tracking, "agents") == "3"


def test_a_restart_half_way_registers_nothing_twice(tm_home, job_factory, tracking):
    from trainmaster.broker.promotion import hook
    from trainmaster.broker.promotion.records import PromotionStore
    from trainmaster.broker.store import Store

    configure(tm_home, tracking)
    job = submit(job_factory(MAKE_MODEL, SPEC, name="restarted"), 0.9)
    records = PromotionStore(tm_home / "state.db")
    try:  # as if the process died after making the run and the version but before recording either
        records.advance(job["id"], "pending", run_id=None, version=None, gate=None)
    finally:
        records.close()
    store = Store(tm_home / "state.db")
    try:
        hook.retry_pending(store)
        hook.on_accepted(store, job["id"])
    finally:
        store.close()
    assert [v.version for v in client(tracking).search_model_versions("name = 'restarted'")] == ["1"]
    experiment = client(tracking).get_experiment_by_name("trainmaster/restarted")
    assert len(client(tracking).search_runs([experiment.experiment_id])) == 1
    assert promotion(tm_home, job["id"]).state == "done"
    records = PromotionStore(tm_home / "state.db")
    try:
        assert [m.version for m in records.moves("restarted")] == ["1"]  # the move found made, recorded once
    finally:
        records.close()


def test_a_registry_down_at_accept_time_leaves_the_promotion_pending_until_the_next_pass(tm_home, job_factory,
                                                                                         tracking):
    configure(tm_home, f"http://127.0.0.1:{mlflow_server.free_port()}")  # nothing listens there
    job = submit(job_factory(MAKE_MODEL, SPEC, name="offline"), 0.9)  # still accepted
    pending = promotion(tm_home, job["id"])
    assert pending.state == "pending" and "MLflow at http://127.0.0.1:" in pending.error, pending
    configure(tm_home, tracking)
    assert tm("ls", home=tm_home).returncode == 0  # a read: it starts the background pass, which carries it on
    deadline = time.time() + 60
    while (done := promotion(tm_home, job["id"])).state != "done" and time.time() < deadline:
        time.sleep(0.5)
    assert (done.state, done.version, done.gate, done.error) == ("done", "1", "passed", None)
    assert production(tracking, "offline") == "1"
