"""The Ray backend end to end through the real CLI against a real Ray cluster on 127.0.0.1 (tests/ray_cluster.py:
a head with 2 CPUs and a second node with 1, started once per test process for this file and bench_ray's smoke run:
tests/conftest.py SHARED_GROUPS): a tiny job accepted, run through the
Jobs API and the shared launcher; a 2-process gloo job on one node and a 2-node one (Ray Train's TorchTrainer,
a worker per process); cancel stops every process of the job, on one node or two, even one that ignores SIGTERM; a
`kill -9` of the job on its node is `lost`, retried from the last committed segment to the bits of an
uninterrupted run; a cluster that does not answer drops out of the plan with its reason and local runs the job,
and one that stops answering under a running attempt loses it past the policy's deadline, so local runs the job;
`environment: requirements` installed on the nodes by Ray's runtime environment from a local wheel folder;
`ray:spot` is refused in a policy."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import signal
import sqlite3
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import psutil
import pytest

from miner_support import shown, tm
from ray_cluster import RayCluster, free_port
from tcp_relay import Relay
from tiny_lm_job import EVALUATOR, JOB, TINY_LM
from trainmaster.backends.base import AttemptContext, BackendError, Cause, Offer, OfferRequest, Phase
from trainmaster.backends.ray.backend import RayBackend
from trainmaster.backends.ray.config import RayConfig
from trainmaster.jobs.bundle import build_bundle
from trainmaster.jobs.spec import load_spec

pytestmark = pytest.mark.slow

POLICY = "name: ray\ndefault:\n  primary: ray\n  fallbacks: [local]\n  retries: 1\n"
WAIT_S = 90
LM_STEPS = 100
"""The tiny-lm job's steps (4 segments of 25): the kill tests kill it once segment 1 is committed (step 50), so it
still has 50 steps to run then (~5 s of CPU a process), and it resumes from there."""
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


@pytest.fixture
def cluster(ray_cluster):
    """The Ray cluster this worker shares with bench_ray's smoke run (tests/conftest.py SHARED_GROUPS)."""
    return ray_cluster


@pytest.fixture
def idle(cluster):
    """The cluster once every CPU is free again (a job of the test before may still be counted)."""
    cluster.wait_idle()
    return cluster


@pytest.fixture
def ray_home(idle, tm_home, tmp_path):
    """backends.yaml pointing at the cluster (its storage path shared, this interpreter on the nodes); the policy."""
    (tm_home / "config").mkdir(parents=True)
    (tm_home / "config" / "backends.yaml").write_text(
        f"ray:\n  address: {idle.address}\n  storage_path: {idle.storage}\n  python: {sys.executable}\n")
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
    """The attempt's launchers and job processes on the cluster's nodes: the launchers by the synced folder
    their plan names, and every process below them (rank 1's job writes to scratch, not the synced folder)."""
    marker = str(cluster.storage / "attempts" / attempt_id)
    found = {}
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            env = proc.environ()
            launcher = "trainmaster.jobs.launcher" in (proc.info["cmdline"] or []) and marker in env.get(
                "TRAINMASTER_LAUNCH", "")
            if launcher or env.get("TRAINMASTER_OUTPUT_DIR", "").startswith(marker):
                found.update({p.pid: p for p in [proc, *(proc.children(recursive=True) if launcher else [])]})
        except psutil.Error:
            continue
    return [p for p in found.values() if _running(p)]


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


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
    with pytest.raises(BackendError, match="HTTP 404 .*Job tm-none does not exist"):
        asyncio.run(backend.jobs.info("tm-none"))
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


@pytest.mark.usefixtures("idle")
def test_offers_come_from_what_the_nodes_have_free(cluster, tmp_path):
    spec = load_spec(script_job(tmp_path / "code", "import time\ntime.sleep(120)\n"))
    two = spec.spec.model_copy(update={"resources": spec.spec.resources.model_copy(update={"cpus": 2})})
    info = build_bundle(spec.code_dir, spec.spec.canonical_json(), tmp_path / "bundles")
    backend = RayBackend(RayConfig(address=cluster.address, storage_path=str(cluster.storage), python=sys.executable))
    [idle] = asyncio.run(backend.offers(OfferRequest(spec=two))).offers
    assert idle.cpus == 2 and idle.detail["fitting_nodes"] == 1, idle  # the head, 2 CPUs free
    ctx = AttemptContext(job_id="j", attempt_id="busy-1", bundle_sha256=info.sha256, seed=1,
                         workdir=str(tmp_path / "attempt"))
    handle = asyncio.run(backend.submit(info.path, two, idle, ctx))  # holds the head's 2 CPUs while it sleeps
    try:
        busy = wait_for("the usage report to show the job's CPUs held", lambda: (  # both: a report may show one
            (found := asyncio.run(backend.offers(OfferRequest(spec=two)))).reasons  # held before the other
            and "0 CPU(s) free" in found.reasons[0] and found))
        assert not busy.offers and "no node of the Ray cluster has 2 CPU(s)" in busy.reasons[0], busy
        assert "0 CPU(s) free" in busy.reasons[0] and "1 CPU(s) free" in busy.reasons[0], busy
        [small] = asyncio.run(backend.offers(OfferRequest(spec=spec.spec))).offers  # the second node's one CPU
        assert (small.cpus, small.detail["fitting_nodes"]) == (1, 1), small
    finally:
        asyncio.run(backend.cancel(handle))


def test_a_bundle_that_does_not_match_is_refused_on_the_node(cluster, tmp_path):
    _, (handle, _), end = backend_run(cluster, tmp_path, WRITES, "direct-2", sha256="0" * 64)
    assert end.phase is Phase.failed and end.cause is Cause.script_failed and end.exit_code == 2, end
    assert "the bundle is refused" in end.reason, end


class Accepted:
    """A job the CLI ran on the cluster to `accepted`: its home, the submit's finished process and JSON."""

    def __init__(self, home: Path, done: subprocess.CompletedProcess):
        self.home, self.done, self.job = home, done, shown(done)


@pytest.fixture(scope="module")
def accepted_lm(tmp_path_factory):
    """One tiny-lm job of LM_STEPS steps on one node submitted through the CLI (`submit --wait --json`) with the
    file's policy, run on the cluster to the end: the uninterrupted run both kill tests' killed runs must resume
    to (the bits; on two nodes too: each process of the job trains the whole model, the recipe is not
    data-parallel), and the accepted Ray job whose log, offer, cost and outputs the tiny-job test reads. One job
    on the cluster instead of three."""
    from background_support import stop_background
    from ray_cluster import shared

    cluster = shared()
    cluster.wait_idle()
    root = tmp_path_factory.mktemp("accepted")
    home = root / "home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "backends.yaml").write_text(
        f"ray:\n  address: {cluster.address}\n  storage_path: {cluster.storage}\n  python: {sys.executable}\n")
    (root / "policy.yaml").write_text(POLICY)
    spec = lm_job(root / "lm", steps=LM_STEPS)
    spec.write_text(spec.read_text() + "resources:\n  nodes: 1\n")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRAINMASTER_HOME", str(home))
        done = tm("submit", str(spec), "--policy", str(root / "policy.yaml"), "--wait", "--json")
    yield Accepted(home, done)
    stop_background(home)


def test_a_tiny_job_runs_on_the_cluster_and_is_accepted(accepted_lm, monkeypatch):
    job, done = accepted_lm.job, accepted_lm.done
    assert job["state"] == "accepted", job
    assert " INFO " not in done.stderr and "Uploading package" not in done.stderr, done.stderr  # Ray's own lines
    [attempt] = job["attempts"]
    assert attempt["backend"] == "ray", attempt
    monkeypatch.setenv("TRAINMASTER_HOME", str(accepted_lm.home))
    log = tm("logs", job["id"]).stdout
    assert "node 0 of 1" in log and "tiny_lm" in log, log
    db = sqlite3.connect(accepted_lm.home / "state.db")
    offer, cost = db.execute("SELECT offer_json, cost_micro_usd FROM attempts WHERE job_id = ?", (job["id"],)).fetchone()
    assert json.loads(offer)["quote"]["source"] == "power model" and cost > 0
    assert (accepted_lm.home / "jobs" / job["id"] / "outputs" / "model.safetensors").is_file()


def test_a_ray_job_whose_policy_asks_for_the_replay_audit_is_audited_within_tau(ray_home, tmp_path):
    (tmp_path / "audited.yaml").write_text("name: audited\ndefault:\n  primary: ray\nverification:\n"
                                           "  trusted: [integrity, safety, replay, outcome]\n  tau: 0.05\n")
    job = shown(tm("submit", str(lm_job(tmp_path / "lm", steps=50)), "--policy", str(tmp_path / "audited.yaml"),
                   "--wait", "--json"))
    assert job["state"] == "accepted" and [a["backend"] for a in job["attempts"]] == ["ray"], job
    verdict = json.loads((ray_home / "jobs" / job["id"] / "verdict.json").read_text())
    assert verdict["outcome"] == "accepted" and "replay" in verdict["checks"], verdict
    replay = verdict["evidence"]["replay"]
    assert replay["passed"] and replay["segments"], replay
    # within the policy's τ, not bit-exact (local's trusted replay demands r = 0): Ray's nodes may differ
    assert (replay["tau"], replay["tau_source"]) == (0.05, "explicit"), replay


@pytest.mark.parametrize("nodes", [1, 2])
def test_cancel_stops_every_process_of_the_job(cluster, ray_home, tmp_path, nodes):
    stubborn = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "print('started', flush=True)\ntime.sleep(300)\n")
    spec = script_job(tmp_path / "long", stubborn)
    spec.write_text(spec.read_text() + f"resources:\n  nodes: {nodes}\n")
    job = shown(tm("submit", str(spec), "--policy", str(tmp_path / "policy.yaml"), "--json"))
    attempt = wait_for("an attempt", lambda: shown(tm("status", job["id"], "--json"))["attempts"])[0]
    wait_for(f"the job's {nodes} process(es)", lambda: sum("train.py" in " ".join(p.cmdline())
                                                           for p in job_processes(cluster, attempt["id"])) == nodes)
    cancelled = tm("cancel", job["id"], "--json")
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    wait_for("every process of the job gone", lambda: not job_processes(cluster, attempt["id"]), timeout=30)
    final = shown(tm("status", job["id"], "--json"))
    assert final["state"] == "cancelled" and [a["state"] for a in final["attempts"]] == ["cancelled"], final


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_job_killed_on_its_node_is_lost_and_resumes_to_the_same_bits(cluster, ray_home, tmp_path, nodes,
                                                                       accepted_lm):
    """On one node, the launcher and its job; on two (Ray Train), every worker's: killed as with their machines.
    The uninterrupted run to match: the module's accepted run of the same training on one node (`accepted_lm`):
    on two nodes each process trains the whole model too (the recipe is not data-parallel), so the job's bits
    are the same as on one (rank 0 writes them), and a resume that lost or repeated a step would differ."""
    policy = str(tmp_path / "policy.yaml")
    spec = lm_job(tmp_path / "killed", steps=LM_STEPS)
    spec.write_text(spec.read_text() + f"resources:\n  nodes: {nodes}\n")
    assert accepted_lm.job["state"] == "accepted", accepted_lm.job
    plain_hash = model_hash(accepted_lm.home, accepted_lm.job["id"])
    cluster.wait_idle()
    before = set((cluster.storage / "attempts").iterdir())
    submit = subprocess.Popen([sys.executable, "-m", "trainmaster.broker.cli", "submit", str(spec), "--policy",
                               policy, "--wait", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        sync = wait_for("the attempt's synced folder", lambda: set((cluster.storage / "attempts").iterdir()) - before)
        [sync] = sync
        segment = sync / "checkpoints" / "segments" / "00000001" / "manifest.json"  # on two nodes Ray Train starts
        wait_for("a committed segment", segment.is_file, timeout=WAIT_S * 2)  # its controller's actors first
        killed = job_processes(cluster, sync.name)  # the nodes' side of the job dies at once, as with its machines
        assert sum("trainmaster.jobs.launcher" in p.cmdline() for p in killed) == nodes, killed
        for proc in killed:
            proc.send_signal(signal.SIGKILL)
        out, err = submit.communicate(timeout=WAIT_S * 2)
        job = json.loads(out[out.index("{"):]) if "{" in out else pytest.fail(out + err)
        assert job["state"] == "accepted", job
        first, second = job["attempts"]
        assert first["backend"] == second["backend"] == "ray", job["attempts"]
        assert first["state"] == "failed" and "its node or driver died" in first["reason"], first
        db = sqlite3.connect(ray_home / "state.db")
        [detail] = db.execute("SELECT detail FROM events WHERE attempt_id = ? AND to_state = 'failed'",
                              (first["id"],)).fetchone()
        assert json.loads(detail)["cause"] == "lost", detail
        assert (cluster.storage / "attempts" / second["id"] / "checkpoints" / "segments" / "00000001").is_dir()
        assert model_hash(ray_home, job["id"]) == plain_hash
    finally:  # a failure above leaves no job holding the shared cluster's CPUs for the tests after this one
        if submit.poll() is None:
            submit.kill()
            for attempt in set((cluster.storage / "attempts").iterdir()) - before:
                with contextlib.suppress(BackendError):  # one never submitted
                    asyncio.run(RayBackend(RayConfig(address=cluster.address)).jobs.stop("tm-" + attempt.name))


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
    log = tm("logs", job["id"]).stdout  # rank 0's launcher, run by a Ray Train worker: the script directly
    assert "node 0 of 2, process 0 of 2" in log and "$ python train.py" in log and "torch.distributed" not in log, log
    assert (cluster.storage / "ray-train" / job["attempts"][0]["id"]).is_dir()  # Ray Train's run state


def local_wheel(folder: Path) -> Path:
    """A tiny pure-Python wheel, tm-probe 1.0 (module tm_probe), written by hand into `folder`: a package no index
    has, so it can only come from there."""
    files = {"tm_probe.py": b"VALUE = 42\n",
             "tm_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tm-probe\nVersion: 1.0\n",
             "tm_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                             b"Tag: py3-none-any\n"}
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for name, data in files.items()) + "tm_probe-1.0.dist-info/RECORD,,\n"
    folder.mkdir(parents=True)
    wheel = folder / "tm_probe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in [*files.items(), ("tm_probe-1.0.dist-info/RECORD", record.encode())]:
            zf.writestr(name, data)
    return wheel


def test_requirements_are_installed_on_the_nodes_from_a_local_wheel_folder(cluster, ray_home, tmp_path):
    wheels = local_wheel(tmp_path / "wheels").parent
    with (ray_home / "config" / "backends.yaml").open("a") as config:  # pip on the nodes never reaches an index
        config.write(f"  pip_install_options: [--no-index, --find-links, '{wheels}']\n")
    script = ("import os, sys, yaml, tm_probe\n"
              "open(os.path.join(os.environ['TRAINMASTER_OUTPUT_DIR'], 'probe.txt'), 'w').write(\n"
              "    f'{tm_probe.VALUE} {tm_probe.__file__} {sys.prefix}')\n")
    spec = script_job(tmp_path / "job", script)
    spec.write_text(spec.read_text() + "environment:\n  python: requirements\n")
    (spec.parent / "requirements.txt").write_text("pyyaml  # as the local backend's test\ntm-probe==1.0\n")
    job = shown(tm("submit", str(spec), "--policy", str(tmp_path / "policy.yaml"), "--wait", "--json"))
    assert job["state"] in ("accepted", "succeeded") and [a["backend"] for a in job["attempts"]] == ["ray"], job
    value, where, prefix = (ray_home / "jobs" / job["id"] / "outputs" / "probe.txt").read_text().split()
    assert value == "42" and where.startswith(prefix) and "runtime_resources/pip" in prefix, (where, prefix)
    assert prefix != sys.prefix  # the runtime environment's virtualenv, not the node's own interpreter


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


@pytest.mark.usefixtures("idle")
def test_a_cluster_that_stops_answering_loses_the_attempt_and_local_runs_the_job(cluster, tm_home, tmp_path):
    relay = Relay(cluster.dashboard_port).start()  # the head as this machine reaches it, until the relay stops
    (tm_home / "config").mkdir(parents=True)
    (tm_home / "config" / "backends.yaml").write_text(
        f"ray:\n  address: http://127.0.0.1:{relay.port}\n  storage_path: {cluster.storage}\n"
        f"  python: {sys.executable}\n  timeout_s: 2\n")
    (tmp_path / "policy.yaml").write_text("name: ray\ndefault:\n  primary: ray\n  fallbacks: [local]\n  retries: 0\n"
                                          "  unreachable_after_s: 3\n")
    on_ray_waits = WRITES + "import os, time\nif os.environ.get('RAY_ADDRESS'):\n    time.sleep(120)\n"
    submit = subprocess.Popen([sys.executable, "-m", "trainmaster.broker.cli", "submit",
                               str(script_job(tmp_path / "job", on_ray_waits)), "--policy",
                               str(tmp_path / "policy.yaml"), "--wait", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    attempt, before = None, set((cluster.storage / "attempts").iterdir())
    try:
        sync = wait_for("the job running on the cluster", lambda: [
            p for p in set((cluster.storage / "attempts").iterdir()) - before
            if (p / "job.log").is_file() and "$ python train.py" in (p / "job.log").read_text()])
        attempt = sync[0].name
        relay.stop()
        out, err = submit.communicate(timeout=WAIT_S)
        job = json.loads(out[out.index("{"):]) if "{" in out else pytest.fail(out + err)
        assert job["state"] == "accepted" and len(job["attempts"]) == 2, job
        first, second = job["attempts"]
        assert (first["backend"], first["state"], second["backend"]) == ("ray", "failed", "local"), job["attempts"]
        assert "unreachable for" in first["reason"] and "does not answer" in first["reason"], first
        db = sqlite3.connect(tm_home / "state.db")
        events = db.execute("SELECT kind, to_state, detail FROM events WHERE attempt_id = ?", (first["id"],)).fetchall()
        assert [kind for kind, _, _ in events].count("unreachable") == 1, events  # first found unreachable, once
        assert json.loads(next(d for _, to, d in events if to == "failed"))["cause"] == "lost", events
    finally:
        submit.kill()
        relay.stop()
        if attempt is not None:  # the job ran on, out of the broker's reach: stop it on the cluster itself
            asyncio.run(RayBackend(RayConfig(address=cluster.address)).jobs.stop("tm-" + attempt))
            wait_for("the job's processes gone", lambda: not job_processes(cluster, attempt), timeout=30)


def test_ray_spot_is_refused_in_a_policy(tm_home, tmp_path):
    (tmp_path / "policy.yaml").write_text("name: spot\ndefault:\n  primary: ray:spot\n")
    done = tm("policy", "check", str(tmp_path / "policy.yaml"))
    assert done.returncode != 0 and "ray has no spot or on-demand capacity" in done.stdout + done.stderr, done
