"""The Ray backend's overhead: submit → the entrypoint starting on a Ray cluster vs on `local`, and the engine's own
part (a bare Jobs API submission → its entrypoint starting) printed apart; the steps/s of a DDP job with 2
workers vs 1 (gloo on CPU: the scaling efficiency, 1.0 ideal, per added worker), the 2 workers on one node
(torchrun under the launcher; the test cluster's head has 2 CPUs) and on two nodes (Ray Train's TorchTrainer,
a worker of 1 CPU on each node); plus `trainmaster --help` with ray installed (it must not import Ray: ≤ 0.10 s).

The backends' figures are timed from the job's `submitted` event to the first line of its script (as
bench_overhead.py does for local), the median of 10 runs (1 in the smoke run), each through a fresh
`trainmaster submit --wait` against a real two-node cluster on 127.0.0.1 (tests/ray_cluster.py), stopped after.
Ray's path adds its working_dir upload, its job supervisor actor and the shared launcher's bundle check.

Run: python tests/benchmarks/bench_ray.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from _common import median_seconds, print_figures  # noqa: E402
from ray_cluster import RayCluster  # noqa: E402

SCRIPT = """\
import time; started = time.time()
import os, pathlib
(pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"]) / "times.json").write_text('{"started": %r}' % started)
"""
DDP = """\
import os, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randn(64, 1)
steps = int(os.environ["STEPS"])
for i in range(steps + 5):
    if i == 5:
        began = time.perf_counter()
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
if dist.get_rank() == 0:
    rate = steps / (time.perf_counter() - began)
    open(os.path.join(os.environ["TRAINMASTER_OUTPUT_DIR"], "rate.txt"), "w").write(str(rate))
dist.barrier()
dist.destroy_process_group()
"""
BARE = "python -c 'import time; print(\"STARTED\", time.time())'"


def cli(env: dict[str, str], *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", *args], capture_output=True, text=True,
                          env=env)
    if "{" not in done.stdout:
        raise RuntimeError(f"trainmaster {' '.join(args)}: {done.stdout}{done.stderr}")
    return json.loads(done.stdout[done.stdout.index("{"):])


def to_start(root: Path, home: Path, policy: Path | None, cluster: RayCluster | None = None) -> float:
    """Seconds from the job's `submitted` event to its script's first line (on `cluster` once it is idle)."""
    if cluster is not None:
        cluster.wait_idle()
    code = root / f"job-{time.time_ns()}"
    code.mkdir()
    (code / "train.py").write_text(SCRIPT)
    (code / "job.yaml").write_text("name: start\nentrypoint: python train.py\n")
    env = {**os.environ, "TRAINMASTER_HOME": str(home)}
    job = cli(env, "submit", str(code / "job.yaml"), *(["--policy", str(policy)] if policy else []), "--wait", "--json")
    assert job["state"] == "accepted", job
    started = json.loads((Path(job["outputs_dir"]) / "times.json").read_text())["started"]
    submitted = [e["at"] for e in cli(env, "status", job["id"], "--json")["events"] if e["to"] == "submitted"][0]
    return started - submitted


def ddp_steps_per_s(cluster: RayCluster, root: Path, home: Path, policy: Path, workers: int, steps: int,
                    nodes: int = 1) -> float:
    """Steps/s of rank 0 of a DDP job of `workers` processes on each of `nodes` nodes."""
    cluster.wait_idle()  # offers count free CPUs: the job before may still be counted for a few seconds
    code = root / f"ddp-{workers}-{nodes}-{time.time_ns()}"
    code.mkdir()
    (code / "train.py").write_text(DDP)
    (code / "job.yaml").write_text(f"name: ddp\nentrypoint: python train.py\nlauncher: torchrun\n"
                                   f"env: {{STEPS: '{steps}'}}\nresources:\n  cpus: {workers}\n  processes: {workers}\n"
                                   f"  nodes: {nodes}\n")
    env = {**os.environ, "TRAINMASTER_HOME": str(home)}
    job = cli(env, "submit", str(code / "job.yaml"), "--policy", str(policy), "--wait", "--json")
    if job["state"] not in ("accepted", "succeeded"):  # the job's own log says why (a bare exit code does not)
        log = subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "logs", job["id"]], capture_output=True,
                             text=True, env=env)
        raise AssertionError(f"{job['id']} ended {job['state']}: {job['reason']}\n{log.stdout[-4000:]}{log.stderr}")
    return float((Path(job["outputs_dir"]) / "rate.txt").read_text())


def engine_start(address: str, repeat: int) -> float:
    """Median seconds from a bare Jobs API submit to its entrypoint's first line (Ray's own overhead)."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(address)
    samples = []
    for _ in range(repeat):
        sent = time.time()
        job = client.submit_job(entrypoint=BARE)
        while not client.get_job_status(job).is_terminal():
            time.sleep(0.05)
        line = next(line for line in client.get_job_logs(job).splitlines() if line.startswith("STARTED"))
        samples.append(float(line.split()[1]) - sent)
    return statistics.median(samples)


def ray_home(root: Path, cluster: RayCluster) -> tuple[Path, Path]:
    home = root / "home-ray"
    (home / "config").mkdir(parents=True)
    (home / "config" / "backends.yaml").write_text(
        f"ray:\n  address: {cluster.address}\n  storage_path: {cluster.storage}\n  python: {sys.executable}\n")
    policy = root / "ray.yaml"
    policy.write_text("name: ray\ndefault:\n  primary: ray\n")
    return home, policy


SMOKE_FIXTURES = ("ray_cluster",)
"""The smoke run uses the Ray cluster the Ray backend's tests share (tests/conftest.py), not one of its own."""


def run(smoke: bool = False, ray_cluster: RayCluster | None = None) -> dict[str, float]:
    """The figures, on `ray_cluster` when given (left running), else on a cluster of its own (stopped after)."""
    repeat = 1 if smoke else 10
    root = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    cluster = ray_cluster or RayCluster().start()
    try:
        home, policy = ray_home(root, cluster)
        figures = {
            "ray: submitted → entrypoint start (s, median)":
                statistics.median(to_start(root, home, policy, cluster) for _ in range(repeat)),
            "local: submitted → entrypoint start (s, median)":
                statistics.median(to_start(root, root / "home-local", None) for _ in range(repeat)),
            "Ray Jobs API alone: submit → entrypoint start (s, median)": engine_start(cluster.address, repeat),
        }
        steps = 20 if smoke else 300
        one, two = (ddp_steps_per_s(cluster, root, home, policy, workers, steps) for workers in (1, 2))
        spread = ddp_steps_per_s(cluster, root, home, policy, 1, steps, nodes=2)
        figures.update({"DDP on Ray, 1 worker (steps/s)": one, "DDP on Ray, 2 workers on 1 node (steps/s)": two,
                        "scaling efficiency, 2 workers on 1 node (steps/s ratio)": two / one,
                        "DDP on Ray Train, 2 workers on 2 nodes (steps/s)": spread,
                        "scaling efficiency, 2 workers on 2 nodes (steps/s ratio)": spread / one})
    finally:
        if ray_cluster is None:
            cluster.stop()
    figures["trainmaster --help (s, median of 5)"] = median_seconds(
        lambda: subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "--help"], capture_output=True,
                               check=True), 1 if smoke else 5)
    print_figures("Ray backend overhead", figures, {"trainmaster --help (s, median of 5)": "≤ 0.10"})
    return figures


if __name__ == "__main__":
    run(smoke="--smoke" in sys.argv)
