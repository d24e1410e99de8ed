"""The AWS backend end to end through the real CLI: `trainmaster submit JOB --wait` under a policy whose primary is
aws spot, backends.yaml pointing at moto on 127.0.0.1 (fake keys only), and the runner of tests/clouds/aws_runner.py
playing SageMaker (the real launcher in a subprocess per instance). Covers: a managed-spot interruption resumed from
the synced checkpoints to the bits of an uninterrupted run, fetched, verified and charged price × billable seconds
× instances plus the estimated parts; a 2-node gloo job; throttling and 5xx retried; capacity refused at submit
(the offer blocked, the policy falls back to local); a job failing inside SageMaker; a cancel."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clouds.aws_runner import SageMakerRunner
from clouds.aws_server import BUCKET, REGION, ROLE, fail_next, training_job, training_jobs
from miner_support import shown, tm
from state_rows import state_rows
from tiny_lm_job import EVALUATOR, JOB, TINY_LM, short_job

pytest_plugins = ["clouds.conftest_aws"]
pytestmark = pytest.mark.slow

POLICY = ("name: aws\ndefault:\n  primary: aws:spot\n  fallbacks: [local]\n  retries: 1\n"
          "  constraints:\n    max_usd_per_hour: 0.05\n")
"""One aws offer (ml.m5.large spot in us-east-1, the cheapest), tried once more after a preemption, then this machine."""
DIST = """\
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
out = os.environ["TRAINMASTER_OUTPUT_DIR"]
if dist.get_rank() == 0:
    open(os.path.join(out, "sum.txt"), "w").write(f"{t.item():.0f} {dist.get_world_size()}")
dist.destroy_process_group()
"""


@pytest.fixture
def cloud(aws, tm_home, tmp_path, test_image):
    """backends.yaml pointing at moto (the default image and setup), the policy, and the runner playing SageMaker."""
    (tm_home / "config").mkdir(parents=True)
    (tm_home / "config" / "backends.yaml").write_text(
        f"aws:\n  endpoint_url: {aws.endpoint}\n  region: {REGION}\n  s3_bucket: {BUCKET}\n"
        f"  sagemaker_role_arn: {ROLE}\n  poll_s: 0.1\n")
    (tmp_path / "policy.yaml").write_text(POLICY)
    with SageMakerRunner(aws, tmp_path / "sagemaker", test_image) as runner:
        yield runner


def lm_job(root: Path, steps: int | None = None) -> Path:
    """The tiny LM's job folder: `steps` steps in segments of 25, or by default the short run (tests/tiny_lm_job.py:
    40 steps in 4 segments of 10), enough for an interruption after a segment and a resume from it."""
    root.mkdir(parents=True)
    (root / "job.yaml").write_text(short_job() if steps is None else JOB.format(entrypoint=TINY_LM.format(steps=steps)))
    (root / "evaluate.py").write_text(EVALUATOR)
    return root / "job.yaml"


def submit(spec: Path, policy: Path) -> dict:
    done = tm("submit", str(spec), "--policy", str(policy), "--wait", "--json")
    return shown(done)


def outputs(tm_home: Path, job_id: str) -> dict[str, str]:
    root = tm_home / "jobs" / job_id / "outputs"
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_spot_interruption_resumes_to_the_same_bits_and_is_charged_as_billed(cloud, aws, tm_home, tmp_path):
    policy = tmp_path / "policy.yaml"
    plain = submit(lm_job(tmp_path / "plain"), policy)
    assert plain["state"] == "accepted", plain
    before = set(training_jobs())

    cloud.interrupt = "restart"
    job = submit(lm_job(tmp_path / "spot"), policy)
    assert job["state"] == "accepted", job
    assert [a["backend"] for a in job["attempts"]] == ["aws"], json.dumps(job["attempts"], indent=1)
    [name] = set(training_jobs()) - before
    assert cloud.launches[name] == 2  # interrupted once, restarted by "SageMaker" from the synced checkpoints
    sm = training_job(name)
    assert sm.enable_managed_spot_training and sm.billable_time_in_seconds < sm.training_time_in_seconds
    resumed, uninterrupted = outputs(tm_home, job["id"]), outputs(tm_home, plain["id"])
    assert resumed["model.safetensors"] == uninterrupted["model.safetensors"]  # the same final weights, bit for bit

    log = tm("logs", job["id"])
    assert "node 0 of 1" in log.stdout, log.stdout + log.stderr
    [att] = state_rows(tm_home, "SELECT offer_json, cost_micro_usd FROM attempts WHERE job_id = ?", job["id"])
    offer = json.loads(att["offer_json"])
    assert offer["spot"] and offer["instance"] == "ml.m5.large"
    # managed spot's billable seconds already carry the saving: billed at the row's on-demand price, not the spot one
    on_demand = offer["detail"]["on_demand_micro_usd_per_hour"]
    assert on_demand > offer["price_per_hour_micro_usd"]
    compute = -(-sm.billable_time_in_seconds * 1000 * on_demand // 3_600_000)
    [charge] = state_rows(tm_home,
                          "SELECT micro_usd FROM ledger_entries WHERE job_id = ? AND kind = 'charge'", job["id"])
    sync = f"trainmaster/attempts/{job['attempts'][0]['id']}/sync/"
    stored = sum(o["Size"] for o in aws.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=sync)["Contents"])
    sent = sum(o["Size"] for o in aws.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=sync + "outputs/")["Contents"])
    egress, storage = -(-sent * 90_000 // 10**9), -(-stored * 23_000 // 10**9)  # $0.09/GB out, $0.023/GB-month
    assert charge["micro_usd"] == att["cost_micro_usd"] == compute + egress + storage

    cloud.interrupt = "end"  # SageMaker gives up on the spot job: the broker resumes it in a new attempt
    again = submit(lm_job(tmp_path / "ended"), policy)
    assert again["state"] == "accepted", again
    assert [a["backend"] for a in again["attempts"]] == ["aws", "aws"], json.dumps(again["attempts"], indent=1)
    first = again["attempts"][0]
    assert first["state"] == "failed" and "Interrupted" in first["reason"], first
    resumed_sync = f"trainmaster/attempts/{again['attempts'][1]['id']}/sync/checkpoints/"
    carried = aws.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=resumed_sync + "segments/00000001/")
    assert carried.get("KeyCount"), "the first attempt's checkpoints were not carried into the second's synced folder"
    assert outputs(tm_home, again["id"])["model.safetensors"] == uninterrupted["model.safetensors"]


def test_a_two_node_gloo_job_runs_on_two_instances(cloud, tm_home, tmp_path):
    root = tmp_path / "dist"
    root.mkdir()
    (root / "train.py").write_text(DIST)
    (root / "job.yaml").write_text("name: dist\nentrypoint: python train.py\nlauncher: torchrun\n"
                                   "resources:\n  nodes: 2\n")
    policy = tmp_path / "two.yaml"
    policy.write_text(POLICY.replace("0.05", "0.1"))  # two instances of the cheapest spot offer
    job = submit(root / "job.yaml", policy)
    assert job["state"] in ("accepted", "succeeded"), job
    [name] = training_jobs()
    assert training_job(name).resource_config["InstanceCount"] == 2
    assert (tm_home / "jobs" / job["id"] / "outputs" / "sum.txt").read_text() == "3 2"


def test_throttling_and_5xx_are_retried(cloud, tm_home, tmp_path):
    fail_next("CreateTrainingJob", "ThrottlingException")
    fail_next("DescribeTrainingJob", "InternalFailure", "ServiceUnavailable")
    job = submit(lm_job(tmp_path / "j", steps=25), tmp_path / "policy.yaml")
    assert job["state"] == "accepted", job
    assert [a["backend"] for a in job["attempts"]] == ["aws"]


def test_a_sagemaker_run_is_fetched_verified_and_accepted_without_the_cli_importing_torch(cloud, tm_home, tmp_path):
    """A trusted run whose policy asks for no replay: its verification (in the CLI's process and its pool's, which
    inherit `-X importtime` and write to the CLI's stderr) reads T from the spec and the final weights' header
    without torch. The training itself (the runner's container) does import it, elsewhere."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "trainmaster.broker.cli", "submit",
                           str(lm_job(tmp_path / "j", steps=25)), "--policy", str(tmp_path / "policy.yaml"), "--wait",
                           "--json"], capture_output=True, text=True, env=dict(os.environ), timeout=280)
    job = shown(done)
    assert job["state"] == "accepted" and [a["backend"] for a in job["attempts"]] == ["aws"], job
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "trainmaster.verify.pipeline" in imported and "trainmaster.verify.safeload" in imported
    assert not {name for name in imported if name == "torch" or name.startswith("torch.")}


HIDDEN = """\
import torch
from trainmaster.jobs.recipe import Recipe, RecipeConfig
from trainmaster.jobs.runtime import RuntimeSettings, run
from trainmaster.jobs.state import TrainState


class Config(RecipeConfig):
    steps: int = 40


class Hidden:
    \"\"\"Its steps read a counter its state() leaves out: the self-check, when it runs, fails the run by name.\"\"\"

    def __init__(self, config, seed):
        self.calls, self.w = 0, {"w": torch.zeros(3)}

    def step(self, ctx):
        self.calls += 1
        self.w["w"] += torch.randn(3, generator=ctx.generator("w")) + self.calls

    def state(self):
        return TrainState(weights=self.w, rest={})

    def load_state(self, state):
        self.w = {name: t.clone() for name, t in state.weights.items()}

    def result(self):
        return {}


HIDDEN = Recipe(name="hidden", config_type=Config, build=Hidden)
if __name__ == "__main__":
    run(HIDDEN, Config(), RuntimeSettings.from_env())
"""
KEPT_AND_UNCHECKED = """\
name: hidden
entrypoint: python train.py
checkpoint:
  segment_steps: 10
  keep_every: 2
  selfcheck: false
verification:
  evaluator: python evaluate.py
  thresholds: {finite: 1.0}
"""


def test_the_specs_keep_every_and_selfcheck_hold_on_sagemaker_as_on_local(cloud, aws, tm_home, tmp_path):
    """`checkpoint.keep_every: 2` and `selfcheck: false` reach the runtime in SageMaker's container (they were
    dropped there: it kept every state and always ran the self-check). The recipe hides a counter from state(), so
    a self-check would fail the run on aws and the policy would fall back to local; S_1 is the one state of the
    four segments the run does not keep (S_0, every second, S_{n-1} and S_n are kept)."""
    root = tmp_path / "hidden"
    root.mkdir()
    (root / "train.py").write_text(HIDDEN)
    (root / "job.yaml").write_text(KEPT_AND_UNCHECKED)
    (root / "evaluate.py").write_text(EVALUATOR)
    job = submit(root / "job.yaml", tmp_path / "policy.yaml")
    assert job["state"] == "accepted" and [a["backend"] for a in job["attempts"]] == ["aws"], job
    s3 = aws.client("s3")
    prefix = f"trainmaster/attempts/{job['attempts'][0]['id']}/sync/checkpoints/segments/"
    files: dict[str, set[str]] = {}
    for item in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]:
        segment, name = item["Key"][len(prefix):].split("/", 1)
        files.setdefault(segment, set()).add(name)
    assert sorted(files) == [f"{i:08d}" for i in range(5)], sorted(files)
    assert files["00000001"] == {"manifest.json"}, files  # hashed into its leaf, then dropped
    assert all(len(files[f"{i:08d}"]) > 1 for i in (0, 2, 3, 4)), files
    manifest = json.loads(s3.get_object(Bucket=BUCKET, Key=prefix + "00000001/manifest.json")["Body"].read())
    assert manifest["kept"] is False


def test_capacity_refused_at_submit_blocks_the_offer_and_falls_back_to_local(cloud, tm_home, tmp_path):
    fail_next("CreateTrainingJob", *["ResourceLimitExceeded"] * 8)
    job = submit(lm_job(tmp_path / "j", steps=25), tmp_path / "policy.yaml")
    assert job["state"] == "accepted", job
    assert [a["backend"] for a in job["attempts"]] == ["aws", "local"]
    assert "ResourceLimitExceeded" in (job["attempts"][0].get("reason") or ""), job["attempts"][0]
    assert training_jobs() == {}


def test_a_job_failing_inside_sagemaker_ends_with_its_reason_and_exit_code(cloud, tm_home, tmp_path):
    root = tmp_path / "bad"
    root.mkdir()
    (root / "train.py").write_text("import sys\nprint('about to fail')\nsys.exit(3)\n")
    (root / "job.yaml").write_text("name: bad\nentrypoint: python train.py\n")
    job = submit(root / "job.yaml", tmp_path / "policy.yaml")
    assert job["state"] == "failed", job
    [attempt] = job["attempts"]
    assert attempt["backend"] == "aws" and attempt["reason"] == "exited with code 3: about to fail", attempt
    [name] = training_jobs()
    assert training_job(name).training_job_status == "Failed"


def test_cancel_stops_the_training_job(cloud, tm_home, tmp_path):
    root = tmp_path / "long"
    root.mkdir()
    (root / "train.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(120)\n")
    (root / "job.yaml").write_text("name: long\nentrypoint: python train.py\n")
    job = shown(tm("submit", str(root / "job.yaml"), "--policy", str(tmp_path / "policy.yaml"), "--json"))
    deadline = time.monotonic() + 60
    while not (training_jobs() and next(iter(training_jobs().values())).secondary_status == "Training"):
        assert time.monotonic() < deadline, "the job never started"
        tm("status", job["id"], "--json")
        time.sleep(0.2)
    cancelled = tm("cancel", job["id"], "--json")
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    [name] = training_jobs()
    while training_job(name).training_job_status != "Stopped":
        assert time.monotonic() < deadline, training_job(name).training_job_status
        time.sleep(0.2)
    final = shown(tm("status", job["id"], "--json"))
    assert final["state"] == "cancelled" and [a["state"] for a in final["attempts"]] == ["cancelled"], final


def test_a_missing_bucket_ends_aws_once_and_falls_back_without_a_loop(cloud, aws, tm_home, tmp_path):
    """A configuration failure at dispatch (the bucket backends.yaml names does not exist) ends the aws attempt once
    with S3's reason; aws is not planned again for the job (no other aws offer is tried), and the policy's fallback
    runs it."""
    config = tm_home / "config" / "backends.yaml"
    config.write_text(config.read_text().replace(f"s3_bucket: {BUCKET}", "s3_bucket: tm-no-such-bucket"))
    policy = tmp_path / "any-aws.yaml"
    policy.write_text("name: any-aws\ndefault:\n  primary: aws\n  fallbacks: [local]\n")  # every aws offer allowed
    job = submit(lm_job(tmp_path / "j", steps=25), policy)
    assert job["state"] == "accepted", job
    assert [a["backend"] for a in job["attempts"]] == ["aws", "local"], json.dumps(job["attempts"], indent=1)
    assert "NoSuchBucket" in job["attempts"][0]["reason"], job["attempts"][0]
    [ended] = state_rows(tm_home, "SELECT detail FROM events WHERE attempt_id = ? AND kind = 'attempt' AND "
                                  "to_state = 'failed'", job["attempts"][0]["id"])
    assert json.loads(ended["detail"])["cause"] == "misconfigured"
    assert training_jobs() == {}
