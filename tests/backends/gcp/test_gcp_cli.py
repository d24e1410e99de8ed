"""GCP end to end through the real CLI: `trainmaster submit --wait` under a policy whose primary is gcp, with the
real SDK clients against FakeVertex and the storage emulator, and tests/clouds/gcp_runner.py playing Vertex AI
(the real container launcher, one per replica, through a mirrored /gcs mount)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from miner_support import shown, tm
from tiny_lm_job import EVALUATOR, JOB, TINY_LM

from clouds.gcp_runner import VertexRunner
from state_rows import state_rows

pytest_plugins = ["clouds.conftest_gcp"]
pytestmark = pytest.mark.slow

POLICY = "name: gcp\ndefault:\n  primary: gcp\n  fallbacks: [local]\n"
SEGMENT_STEPS = 25


@pytest.fixture
def runner(gcp, tmp_path, test_image):
    played = VertexRunner(gcp, tmp_path / "vertex", test_image)
    yield played
    played.stop()


def setup(tmp_path, tm_home, gcp, *, steps: int = 50, nodes: int = 1, entrypoint: str | None = None):
    """The job (a tiny LM run in segments), the policy and backends.yaml naming the local servers."""
    job = tmp_path / "job"
    job.mkdir(exist_ok=True)
    text = JOB.format(entrypoint=entrypoint or TINY_LM.format(steps=steps))
    if nodes > 1:
        text += f"resources:\n  nodes: {nodes}\n"
    (job / "job.yaml").write_text(text)
    (job / "evaluate.py").write_text(EVALUATOR)
    (tmp_path / "policy.yaml").write_text(POLICY)
    (tm_home / "config").mkdir(parents=True, exist_ok=True)
    (tm_home / "config" / "backends.yaml").write_text(yaml.safe_dump({"gcp": gcp.config(gcp.credentials)}))
    return job / "job.yaml", tmp_path / "policy.yaml"


def submit(spec, policy) -> dict:
    done = tm("submit", str(spec), "--policy", str(policy), "--wait", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return shown(done)


def model_sha256(folder) -> str:
    return hashlib.sha256(next(folder.rglob("*.safetensors")).read_bytes()).hexdigest()


def test_preempted_resumed_completed_fetched_verified_and_charged(tmp_path, tm_home, gcp, runner):
    spec, policy = setup(tmp_path, tm_home, gcp)
    runner.preempt = 1
    job = submit(spec, policy)
    assert job["state"] == "accepted", job
    assert len(job["attempts"]) == 2, json.dumps(job["attempts"], indent=1)
    first, second = job["attempts"]
    assert (first["backend"], second["backend"]) == ("gcp", "gcp")
    [cause] = state_rows(tm_home, "SELECT state, reason FROM attempts WHERE id = ?", first["id"])
    assert cause["state"] == "failed" and "preempted" in cause["reason"], dict(cause)
    offers = [json.loads(r["offer_json"]) for r in state_rows(tm_home,
                                                              "SELECT offer_json FROM attempts WHERE job_id = ? "
                                                                 "ORDER BY n", job["id"])]
    assert offers[0]["spot"] and offers[0]["instance"] == offers[1]["instance"] == "n1-standard-4"
    vertex_jobs = sorted(gcp.vertex.jobs.values(), key=lambda j: j.name)
    assert [j.state.name for j in vertex_jobs] == ["JOB_STATE_FAILED", "JOB_STATE_SUCCEEDED"]
    strategies = [j.job_spec.scheduling.strategy.name for j in vertex_jobs]
    assert strategies == ["SPOT", "SPOT" if offers[1]["spot"] else "STANDARD"]  # the cheapest offer first: spot
    resumed = gcp.storage_client().bucket("tm-staging").list_blobs(
        prefix=f"runs/attempts/{second['id']}/checkpoints/checkpoints/segments/00000000/")
    assert list(resumed), "the second attempt got the first one's segment"

    out = tm_home / "jobs" / job["id"] / "outputs"  # fetched by the broker once the attempt succeeded
    verdict = json.loads((tm_home / "jobs" / job["id"] / "verdict.json").read_text())
    assert (verdict["outcome"], verdict["attempt_id"]) == ("accepted", second["id"])
    assert verdict["checks"] == ["integrity", "safety", "outcome"]
    assert shown(tm("status", job["id"], "--json"))["state"] == "accepted"
    logs = tm("logs", job["id"])
    assert logs.returncode == 0 and "step" in logs.stdout.lower(), logs.stdout + logs.stderr

    runner.preempt = 0
    spec.parent.joinpath("note.txt").write_text("a second, uninterrupted run of the same training\n")
    straight = submit(spec, policy)
    assert [a["backend"] for a in straight["attempts"]] == ["gcp"]
    assert model_sha256(out) == model_sha256(tm_home / "jobs" / straight["id"] / "outputs")

    [attempt] = state_rows(tm_home, "SELECT offer_json, cost_micro_usd, billable_seconds FROM attempts WHERE id = ?",
                     second["id"])
    offer = json.loads(attempt["offer_json"])
    vertex = vertex_jobs[1]
    seconds = (vertex.end_time - vertex.start_time).total_seconds()
    compute = -(-int(seconds * 1000) * offer["price_per_hour_micro_usd"] // 3_600_000)
    assert attempt["billable_seconds"] == pytest.approx(seconds)
    assert compute <= attempt["cost_micro_usd"] <= compute + 100  # + the estimated egress and storage of kB
    charges = state_rows(tm_home, "SELECT kind, micro_usd FROM ledger_entries WHERE job_id = ? ORDER BY seq", job["id"])
    assert [c["kind"] for c in charges].count("charge") >= 1
    paid = state_rows(tm_home,
                      "SELECT SUM(cost_micro_usd) AS total FROM attempts WHERE job_id = ?", job["id"])[0]["total"]
    assert sum(c["micro_usd"] for c in charges if c["kind"] == "charge") == paid


DDP = """\
import json, os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {total.item()}", flush=True)
if dist.get_rank() == 0:
    with open(os.path.join(os.environ["TRAINMASTER_OUTPUT_DIR"], "sum.json"), "w") as out:
        json.dump({"sum": total.item(), "world": dist.get_world_size()}, out)
dist.destroy_process_group()
"""


def test_a_two_node_gloo_job_runs_on_two_replicas(tmp_path, tm_home, gcp, runner):
    spec, policy = setup(tmp_path, tm_home, gcp)
    spec.write_text("name: ddp\nentrypoint: python ddp.py\nresources:\n  nodes: 2\n")
    (spec.parent / "ddp.py").write_text(DDP)
    job = submit(spec, policy)
    assert job["state"] == "accepted", job
    [created] = gcp.vertex.jobs.values()
    assert [p.replica_count for p in created.job_spec.worker_pool_specs] == [1, 1]
    assert [s["task"]["type"] for s in runner.cluster_specs] == ["workerpool0", "workerpool1"]
    assert runner.played[created.name] == [0, 0]
    result = json.loads((tm_home / "jobs" / job["id"] / "outputs" / "sum.json").read_text())
    assert result == {"sum": 3.0, "world": 2}
    [attempt] = state_rows(tm_home, "SELECT billable_seconds FROM attempts WHERE job_id = ?", job["id"])
    seconds = (created.end_time - created.start_time).total_seconds()
    assert attempt["billable_seconds"] == pytest.approx(2 * seconds)  # per instance, times the instances


def test_throttling_and_5xx_are_retried_until_the_job_starts(tmp_path, tm_home, gcp, runner):
    spec, policy = setup(tmp_path, tm_home, gcp, steps=25)
    gcp.vertex.fail_next("list", 429, "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Resource management "
                                                            "(CRUD) requests' and limit 'requests per minute'")
    gcp.vertex.fail_next("create", 503, "UNAVAILABLE", "The service is currently unavailable.")
    gcp.vertex.fail_next("get", 500, "INTERNAL", "Internal error encountered.")
    job = submit(spec, policy)
    assert job["state"] == "accepted", job
    assert [a["backend"] for a in job["attempts"]] == ["gcp"], json.dumps(job["attempts"], indent=1)
    assert len(gcp.vertex.jobs) == 1 and gcp.vertex.calls("create") == 2
    assert not gcp.vertex.faults["list"] and not gcp.vertex.faults["create"]


def test_a_quota_refused_at_submit_ends_gcp_once_and_falls_back_to_local(tmp_path, tm_home, gcp, runner):
    """The project's quota is the set-up's: one gcp attempt ends with Vertex's words, gcp is not planned again for
    the job (its other offer is not tried), and the policy's fallback runs it."""
    spec, policy = setup(tmp_path, tm_home, gcp, steps=25)
    policy.write_text(POLICY + "  constraints:\n    max_usd_per_hour: 0.25\n")  # n1-standard-4, spot and on demand
    gcp.vertex.fail_next("create", 429, "RESOURCE_EXHAUSTED", "The following quota metrics exceed quota limits: "
                                                              "aiplatform.googleapis.com/custom_model_training_cpus",
                         times=2)
    job = submit(spec, policy)
    assert job["state"] == "accepted", job
    assert [a["backend"] for a in job["attempts"]] == ["gcp", "local"], job["attempts"]
    assert not gcp.vertex.jobs and gcp.vertex.calls("create") == 1
    refused = job["attempts"][0]
    assert "quota" in refused["reason"] and "custom_model_training_cpus" in refused["reason"], refused
    [ended] = state_rows(tm_home, "SELECT detail FROM events WHERE attempt_id = ? AND kind = 'attempt' AND "
                                  "to_state = 'failed'", refused["id"])
    assert json.loads(ended["detail"])["cause"] == "misconfigured"


def test_a_job_failing_in_the_service_ends_with_its_reason_and_exit_code(tmp_path, tm_home, gcp, runner):
    spec, policy = setup(tmp_path, tm_home, gcp, entrypoint="python fail.py")
    (spec.parent / "fail.py").write_text("import sys\nprint('the loss is nan', flush=True)\nsys.exit(3)\n")
    done = tm("submit", str(spec), "--policy", str(policy), "--wait", "--json")
    job = shown(done)
    assert job["state"] == "failed", job
    [attempt] = job["attempts"]
    assert attempt["backend"] == "gcp" and attempt["state"] == "failed"
    assert attempt["reason"] == "exited with code 3: the loss is nan", attempt  # the exit record, its last line
    [created] = gcp.vertex.jobs.values()
    assert created.error.message == "The replica workerpool0-0 exited with a non-zero status of 3."
    assert runner.played[created.name] == [3]


def test_logs_and_metrics_show_while_it_runs_and_cancel_stops_the_vertex_job_and_charges_what_ran(
        tmp_path, tm_home, gcp, runner):
    # far more steps than run before the cancel (it stops the job): at 2,000 the run once ended on its own on a
    # loaded machine between the last look at its state and the cancel, and nothing was left to cancel
    spec, policy = setup(tmp_path, tm_home, gcp, steps=20000)
    waiting = subprocess.Popen([sys.executable, "-m", "trainmaster.broker.cli", "submit", str(spec), "--policy",
                                str(policy), "--wait", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=dict(os.environ))
    try:
        deadline = time.time() + 120
        while not any(j.state.name == "JOB_STATE_RUNNING" for j in gcp.vertex.jobs.values()):
            assert time.time() < deadline and waiting.poll() is None, "the Vertex job never ran"
            time.sleep(0.2)
        [created] = gcp.vertex.jobs.values()
        job_id = created.labels["trainmaster-job"]
        # on Cloud Storage FUSE a file reaches the bucket only once closed: the launcher's closed log parts and
        # whole-file copies make the log and the metrics visible while the job runs
        while "$ python -m trainmaster.jobs.recipes.tiny_lm" not in tm("logs", job_id).stdout:
            assert time.time() < deadline and created.state.name == "JOB_STATE_RUNNING", "no log while running"
            time.sleep(0.5)
        base = created.job_spec.base_output_directory.output_uri_prefix.split("/", 3)[3]
        bucket = gcp.storage_client().bucket("tm-staging")
        while not bucket.blob(base + "checkpoints/outputs/metrics.jsonl").exists():
            assert time.time() < deadline and created.state.name == "JOB_STATE_RUNNING", "no metrics while running"
            time.sleep(0.5)
        assert created.state.name == "JOB_STATE_RUNNING"
        cancelled = tm("cancel", job_id)
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        out, err = waiting.communicate(timeout=120)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    # the broker counts Vertex's CANCELLING as cancelled; the service reaches CANCELLED once the replicas have
    # stopped, which on a loaded machine can come after the waiting command has returned
    stopping = time.time() + 60
    while created.state.name == "JOB_STATE_CANCELLING" and time.time() < stopping:
        time.sleep(0.2)
    assert gcp.vertex.calls("cancel") == 1 and created.state.name == "JOB_STATE_CANCELLED"
    job = shown(tm("status", job_id, "--json"))
    assert job["state"] == "cancelled", job
    [attempt] = job["attempts"]
    assert attempt["state"] == "cancelled" and attempt["billable_seconds"] > 0 and attempt["cost_micro_usd"] > 0
