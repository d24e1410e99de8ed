"""The Ray backend end to end through the real CLI against a real Ray cluster on 127.0.0.1 (tests/ray_cluster.py:
a head with 2 CPUs and a second node with 1, started once for this file): a tiny job accepted, run through the
Jobs API and the shared launcher; a 2-process gloo job on one node and a 2-node one (the gang driver); cancel stops every process of the job, even one that ignores SIGTERM; a
`kill -9` of the job on its node is `lost`, retried from the last committed segment to the bits of an
uninterrupted run; a cluster that does not answer drops out of the plan with its reason and local runs the job;
`ray:spot` is refused in a policy."""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from miner_support import shown, tm
from ray_cluster import RayCluster, free_port
from test_remote_harness import EVALUATOR, JOB, TINY_LM
from trainmaster.backends.base import AttemptContext, Cause, Offer, OfferRequest, Phase
from trainmaster.backends.ray.backend import RayBackend
from trainmaster.backends.ray.config import RayConfig
from trainmaster.jobs.bundle import build_bundle
from trainmaster.jobs.spec import load_spec

pytestmark = pytest.mark.slow

POLICY = "name: ray\ndefault:\n  primary: ray\n  fallbacks: [local]\n  retries: 1\n"
WAIT_S = 90
DIST = """\
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
torch.manual_seed(0)
w = torch.randn(4)  # the same start on every replica; one all-reduced step keeps them equal
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
w -= 0.1 * t
seen = [torch.zeros(4) for _ in range(dist.get_world_size())]
dist.all_gather(seen, w)
same = float(all(torch.equal(seen[0], s) for s in seen))
if dist.get_rank() == 0:
    open(os.path.join(os.environ["TRAINMASTER_OUTPUT_DIR"], "sum.txt"), "w").write(
        f"{t.item():.0f} {dist.get_world_size()} {same}")
dist.destroy_process_group()
"""
WRITES = "import os\nopen(os.path.join(os.environ['TRAINMASTER_OUTPUT_DIR'], 'done.txt'), 'w').write('done')\n"


@pytest.fixture(scope="module")
def cluster():
    found = RayCluster()
    try:
        yield found.start()
    finally:
        found.stop()


@pytest.fixture
def ray_home(cluster, tm_home, tmp_path):
    """backends.yaml pointing at the cluster (its storage path shared, this interpreter on the nodes); the policy."""
    (tm_home / "config").mkdir(parents=True)
    (tm_home / "config" / "backends.yaml").write_text(
        f"ray:\n  address: {cluster.address}\n  storage_path: {cluster.storage}\n  python: {sys.executable}\n")
    (tmp_path / "policy.yaml").write_text(POLICY)
    return tm_home


def lm_job(root: Path, steps: int) -> Path:
    root.mkdir(parents=True)
    (root / "job.yaml").write_text(JOB.format(entrypoint=TINY_LM.format(steps=steps)))
    (root / "evaluate.py").write_text(EVALUATOR)
    return root / "job.yaml"


def script_job(root: Path, script: str) -> Path:
    root.mkdir(parents=True)
    (root / "train.py").write_text(script)
    (root / "job.yaml").write_text("name: script\nentrypoint: python train.py\n")
    return root / "job.yaml"


def model_hash(tm_home: Path, job_id: str) -> str:
    return hashlib.sha256((tm_home / "jobs" / job_id / "outputs" / "model.safetensors").read_bytes()).hexdigest()


def job_processes(cluster: RayCluster, attempt_id: str) -> list[psutil.Process]:
    """The attempt's launcher and job processes on the cluster's nodes (by the synced folder they carry)."""
    marker = str(cluster.storage / "attempts" / attempt_id)
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        launcher = "trainmaster.jobs.launcher" in (proc.info["cmdline"] or []) and marker in env.get("TRAINMASTER_LAUNCH", "")
        if launcher or env.get("TRAINMASTER_OUTPUT_DIR", "").startswith(marker):
            found.append(proc)
    return found


def wait_for(what: str, check, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return found


def backend_run(cluster: RayCluster, root: Path, script: str, attempt: str, sha256: str | None = None):
    """Bundle `script` as a job's train.py and submit it to the cluster with the backend itself, twice; the
    backend, both handles, the spec, and the job's end once it ended."""
    spec = load_spec(script_job(root / "code", script))
    info = build_bundle(spec.code_dir, spec.spec.canonical_json(), root / "bundles")
    backend = RayBackend(RayConfig(address=cluster.address, storage_path=str(cluster.storage), python=sys.executable))
    [offer] = asyncio.run(backend.offers(OfferRequest(spec=spec.spec))).offers
    ctx = AttemptContext(job_id="j", attempt_id=attempt, bundle_sha256=sha256 or info.sha256, seed=1,
                         workdir=str(root / "attempt"))
    handles = [asyncio.run(backend.submit(info.path, spec.spec, offer, ctx)) for _ in range(2)]
    end = wait_for("the job's end", lambda: (st := asyncio.run(backend.status(handles[0]))).phase.done and st)
    return backend, handles, end


def test_a_second_submit_finds_the_first_job_and_logs_and_outputs_read_back(cluster, tmp_path):
    script = WRITES + "for i in range(300):\n    print('line', i, 'é' * (i % 3), flush=True)\n"
    backend, (first, second), end = backend_run(cluster, tmp_path, script, "direct-1")
    assert first == second and end.phase is Phase.succeeded and end.exit_code == 0, end
    from ray.job_submission import JobSubmissionClient

    assert [j.submission_id for j in JobSubmissionClient(cluster.address).list_jobs()].count("tm-direct-1") == 1
    whole = (cluster.storage / "attempts" / "direct-1" / "job.log").read_bytes()
    at = whole.index("é".encode()) + 1  # inside a character: offsets are bytes of the synced log, never shifted
    head, tail = asyncio.run(backend.logs(first, 0)), asyncio.run(backend.logs(first, at))
    assert head.text == whole.decode() and head.next_offset == len(whole) and head.complete
    assert tail.offset == at and tail.next_offset == len(whole) and "line 299" in tail.text
    files = asyncio.run(backend.fetch(first, tmp_path / "fetched"))
    assert [(f.path, f.sha256) for f in files] == [("done.txt", hashlib.sha256(b"done").hexdigest())]
    price = backend.config.power.price_per_hour_micro(0)
    cost = asyncio.run(backend.cost(first, Offer(backend="ray", instance="x", price_per_hour_micro_usd=price)))
    assert cost.billable_seconds > 0 and cost.micro_usd == -(-int(cost.billable_seconds * 1000) * price // 3_600_000)


def test_a_bundle_that_does_not_match_is_refused_on_the_node(cluster, tmp_path):
    _, (handle, _), end = backend_run(cluster, tmp_path, WRITES, "direct-2", sha256="0" * 64)
    assert end.phase is Phase.failed and end.cause is Cause.script_failed and end.exit_code == 2, end
    assert "the bundle is refused" in end.reason, end


def test_a_tiny_job_runs_on_the_cluster_and_is_accepted(ray_home, tmp_path):
    job = shown(tm("submit", str(lm_job(tmp_path / "lm", steps=50)), "--policy", str(tmp_path / "policy.yaml"),
                   "--wait", "--json"))
    assert job["state"] == "accepted", job
    [attempt] = job["attempts"]
    assert attempt["backend"] == "ray", attempt
    log = tm("logs", job["id"]).stdout
    assert "node 0 of 1" in log and "tiny_lm" in log, log
    db = sqlite3.connect(ray_home / "state.db")
    offer, cost = db.execute("SELECT offer_json, cost_micro_usd FROM attempts WHERE job_id = ?", (job["id"],)).fetchone()
    assert json.loads(offer)["quote"]["source"] == "power model" and cost > 0
    assert (ray_home / "jobs" / job["id"] / "outputs" / "model.safetensors").is_file()


def test_cancel_stops_every_process_of_the_job(cluster, ray_home, tmp_path):
    stubborn = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "print('started', flush=True)\ntime.sleep(300)\n")
    job = shown(tm("submit", str(script_job(tmp_path / "long", stubborn)), "--policy", str(tmp_path / "policy.yaml"),
                   "--json"))
    attempt = wait_for("an attempt", lambda: shown(tm("status", job["id"], "--json"))["attempts"])[0]
    wait_for("the job's process", lambda: any("train.py" in " ".join(p.cmdline())
                                              for p in job_processes(cluster, attempt["id"])))
    cancelled = tm("cancel", job["id"], "--json")
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    wait_for("every process of the job gone", lambda: not job_processes(cluster, attempt["id"]), timeout=30)
    final = shown(tm("status", job["id"], "--json"))
    assert final["state"] == "cancelled" and [a["state"] for a in final["attempts"]] == ["cancelled"], final


def test_a_job_killed_on_its_node_is_lost_and_resumes_to_the_same_bits(cluster, ray_home, tmp_path):
    policy = str(tmp_path / "policy.yaml")
    plain = shown(tm("submit", str(lm_job(tmp_path / "plain", steps=300)), "--policy", policy, "--wait", "--json"))
    assert plain["state"] == "accepted", plain
    before = set((cluster.storage / "attempts").iterdir())
    submit = subprocess.Popen([sys.executable, "-m", "trainmaster.broker.cli", "submit",
                               str(lm_job(tmp_path / "killed", steps=300)), "--policy", policy, "--wait", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sync = wait_for("the attempt's synced folder", lambda: set((cluster.storage / "attempts").iterdir()) - before)
    [sync] = sync
    wait_for("a committed segment", lambda: (sync / "checkpoints" / "segments" / "00000001" / "manifest.json").is_file())
    for proc in job_processes(cluster, sync.name):  # the node's side of the job dies at once, as with its machine
        proc.send_signal(signal.SIGKILL)
    out, err = submit.communicate(timeout=WAIT_S * 2)
    job = json.loads(out[out.index("{"):]) if "{" in out else pytest.fail(out + err)
    assert job["state"] == "accepted", job
    first, second = job["attempts"]
    assert first["backend"] == second["backend"] == "ray", job["attempts"]
    assert first["state"] == "failed" and "its node or driver died" in first["reason"], first
    db = sqlite3.connect(ray_home / "state.db")
    [detail] = db.execute("SELECT detail FROM events WHERE attempt_id = ? AND to_state = 'failed'", (first["id"],)).fetchone()
    assert json.loads(detail)["cause"] == "lost", detail
    assert (cluster.storage / "attempts" / second["id"] / "checkpoints" / "segments" / "00000001").is_dir()
    assert model_hash(ray_home, job["id"]) == model_hash(ray_home, plain["id"])


def test_a_two_process_gloo_job_runs_under_torchrun_on_one_node(ray_home, tmp_path):
    root = tmp_path / "dist"
    root.mkdir()
    (root / "train.py").write_text(DIST)
    (root / "job.yaml").write_text("name: dist\nentrypoint: python train.py\nlauncher: torchrun\n"
                                   "resources:\n  cpus: 2\n  processes: 2\n")
    job = shown(tm("submit", str(root / "job.yaml"), "--policy", str(tmp_path / "policy.yaml"), "--wait", "--json"))
    assert job["state"] in ("accepted", "succeeded") and [a["backend"] for a in job["attempts"]] == ["ray"], job
    assert (ray_home / "jobs" / job["id"] / "outputs" / "sum.txt").read_text() == "3 2 1.0"  # both replicas agree


def test_a_two_node_gloo_job_runs_on_two_nodes_of_the_cluster(cluster, ray_home, tmp_path):
    root = tmp_path / "nodes"
    root.mkdir()
    (root / "train.py").write_text(DIST)
    (root / "job.yaml").write_text("name: nodes\nentrypoint: python train.py\nlauncher: torchrun\n"
                                   "resources:\n  nodes: 2\n")
    job = shown(tm("submit", str(root / "job.yaml"), "--policy", str(tmp_path / "policy.yaml"), "--wait", "--json"))
    assert job["state"] in ("accepted", "succeeded") and [a["backend"] for a in job["attempts"]] == ["ray"], job
    assert (ray_home / "jobs" / job["id"] / "outputs" / "sum.txt").read_text() == "3 2 1.0"
    log = tm("logs", job["id"]).stdout
    node0 = cluster.alive_nodes()[0]["node_ip"]  # node 0's address as the cluster knows it: torchrun's rendezvous
    assert "node 0 of 2" in log and f"--nnodes=2 --node-rank=0 --master-addr={node0} " in log, log


def test_an_unreachable_cluster_drops_out_of_the_plan_and_local_runs_the_job(tm_home, tmp_path):
    (tm_home / "config").mkdir(parents=True)
    (tm_home / "config" / "backends.yaml").write_text(
        f"ray:\n  address: http://127.0.0.1:{free_port()}\n  storage_path: {tmp_path}\n  timeout_s: 2\n")
    (tmp_path / "policy.yaml").write_text(POLICY)
    spec = script_job(tmp_path / "job", WRITES)
    offers = tm("offers", str(spec), "--policy", str(tmp_path / "policy.yaml"))
    assert "ray" in offers.stdout and "does not answer" in offers.stdout, offers.stdout + offers.stderr
    job = shown(tm("submit", str(spec), "--policy", str(tmp_path / "policy.yaml"), "--wait", "--json"))
    assert job["state"] in ("accepted", "succeeded"), job
    assert [a["backend"] for a in job["attempts"]] == ["local"], job["attempts"]


def test_ray_spot_is_refused_in_a_policy(tm_home, tmp_path):
    (tmp_path / "policy.yaml").write_text("name: spot\ndefault:\n  primary: ray:spot\n")
    done = tm("policy", "check", str(tmp_path / "policy.yaml"))
    assert done.returncode != 0 and "ray has no spot or on-demand capacity" in done.stdout + done.stderr, done
