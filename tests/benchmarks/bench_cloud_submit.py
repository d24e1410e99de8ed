"""From `trainmaster submit --wait` to the job's own first line, on each cloud's strict fakes (#31).

For each of SageMaker, Vertex AI and Azure ML, a 1-node and a 2-node job through the real CLI, against the local
servers the tests use (moto, FakeVertex with gcp-storage-emulator, FakeAzureML with Azurite; every request
checked against the service's rules), played by the tests' runners in the test image (a Python with torch and
numpy, nothing of trainmaster: tests/clouds/container.py), with the default set-up (nothing installed). The
entrypoint's first statement records the time (rank 0, into its outputs). Figures per cloud and node count:

- `submit_to_entrypoint_s`: from just before the CLI starts to that first statement: the CLI's start, planning,
  the bundle and runtime pack uploads, the job's creation, the runner's start of the containers, the boot script
  (image checks, unpacking the pack), the launcher and, across two nodes, torchrun's rendezvous;
- `container_to_entrypoint_s`: the part from the container's start (what a real image pull and provisioning
  would replace), i.e. trainmaster's own start-up inside the container;
- `runtime_bytes`: the bytes shipped for trainmaster itself (the runtime pack, once per content in the store);
  of which `trainmaster_package_bytes` are the `trainmaster.jobs` package (compressed) and the rest pydantic,
  its compiled core (built for the image's Python) and PyYAML's pure-Python package.

Run: python tests/benchmarks/bench_cloud_submit.py   (smoke: SageMaker, 1 node)
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(Path(__file__).parent)]
from _common import print_figures  # noqa: E402

STARTED = ("import os, time\nstarted = time.time()\n"
           "if os.environ.get('RANK', '0') == '0':\n"
           "    open(os.path.join(os.environ['TRAINMASTER_OUTPUT_DIR'], 'started.txt'), 'w').write(repr(started))\n"
           "print('entrypoint started', flush=True)\n")
"""The job: its first statement records when it started (rank 0 writes it into its outputs)."""
STARTED_2 = STARTED + ("import torch.distributed as dist\ndist.init_process_group('gloo')\ndist.barrier()\n"
                       "dist.destroy_process_group()\n")


def _job(folder: Path, nodes: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "train.py").write_text(STARTED if nodes == 1 else STARTED_2)
    spec = "name: bench\nentrypoint: python train.py\n" + (f"resources:\n  nodes: {nodes}\n" if nodes > 1 else "")
    (folder / "job.yaml").write_text(spec)
    return folder / "job.yaml"


def _cli(home: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, **env, "TRAINMASTER_HOME": str(home)})


def _measure(cloud: str, nodes: int, home: Path, env: dict, runner, work: Path) -> dict:
    spec = _job(work / f"{cloud}-{nodes}", nodes)
    policy = work / f"{cloud}.yaml"
    policy.write_text(f"name: {cloud}\ndefault:\n  primary: {cloud}\n  retries: 0\n")
    before = time.time()
    done = _cli(home, env, "submit", str(spec), "--policy", str(policy), "--wait", "--json")
    shown = json.loads(done.stdout[done.stdout.index("{"):]) if "{" in done.stdout else {}
    if shown.get("state") not in ("accepted", "succeeded"):
        raise RuntimeError(f"{cloud} {nodes}-node job did not finish: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    started = float((home / "jobs" / shown["id"] / "outputs" / "started.txt").read_text())
    container = min(runner.started.values())
    with sqlite3.connect(home / "state.db") as db:
        handle = json.loads(db.execute("SELECT handle_json FROM attempts WHERE job_id = ?", (shown["id"],)).fetchone()[0])
    runner.started.clear()
    return {"submit_to_entrypoint_s": started - before, "container_to_entrypoint_s": started - container,
            "runtime_bytes": handle["data"]["runtime_bytes"]}


def _aws(stack: ExitStack, work: Path, image):
    from clouds.aws_runner import SageMakerRunner
    from clouds.aws_server import BUCKET, REGION, ROLE, MotoAws
    from clouds.conftest_aws import FAKE_ENV

    aws = MotoAws()
    stack.callback(aws.stop)
    for key, value in FAKE_ENV.items():  # the runner's own S3 client
        os.environ.setdefault(key, value)

    def setup(home: Path):
        aws.reset()
        aws.client("s3").create_bucket(Bucket=BUCKET)
        (home / "config").mkdir(parents=True, exist_ok=True)
        (home / "config" / "backends.yaml").write_text(
            f"aws:\n  endpoint_url: {aws.endpoint}\n  region: {REGION}\n  s3_bucket: {BUCKET}\n"
            f"  sagemaker_role_arn: {ROLE}\n  poll_s: 0.1\n")
        return FAKE_ENV
    runner = stack.enter_context(SageMakerRunner(aws, work / "sagemaker", image))
    return setup, runner


def _gcp(stack: ExitStack, work: Path, image):
    import yaml

    from clouds import gcp_server
    from clouds.gcp_runner import VertexRunner

    servers = gcp_server.start()
    stack.callback(servers.stop)
    credentials = servers.credentials_file(work)

    def setup(home: Path):
        servers.reset()
        (home / "config").mkdir(parents=True, exist_ok=True)
        (home / "config" / "backends.yaml").write_text(yaml.safe_dump({"gcp": servers.config(credentials)}))
        return {"STORAGE_EMULATOR_HOST": servers.gcs_url, "NO_GCE_CHECK": "True"}
    os.environ.setdefault("STORAGE_EMULATOR_HOST", servers.gcs_url)
    runner = VertexRunner(servers, work / "vertex", image)
    stack.callback(runner.stop)
    return setup, runner


def _azure(stack: ExitStack, work: Path, image):
    from clouds.azure_runner import AzureMLRunner
    from clouds.azure_server import start_azure
    from clouds.container import IMAGE

    servers = start_azure()
    stack.callback(servers.stop)

    def setup(home: Path):
        servers.fake.reset()
        container = f"c{uuid.uuid4().hex[:12]}"
        servers.fake.datastores["trainmaster_store"] = container
        (home / "config").mkdir(parents=True, exist_ok=True)
        (home / "config" / "backends.yaml").write_text(json.dumps({"azure": {
            "resource_group": "rg", "workspace": "ws", "container": container, "datastore": "trainmaster_store",
            "credential": "clouds.azure_credential:fake", "poll_s": 0.1, "block_mb": 1, "image": IMAGE,
            "region": "eastus"}}))
        return {**servers.env, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    runner = stack.enter_context(AzureMLRunner(servers, work / "azureml", image))
    return setup, runner


def _package_bytes() -> int:
    """The compressed bytes of the pack's `trainmaster.jobs` files (what of the pack is trainmaster's own code)."""
    import zipfile

    from trainmaster.backends.managed import runtime_pack

    with zipfile.ZipFile(runtime_pack.build(runtime_pack.cache_dir()).path) as archive:
        return sum(i.compress_size for i in archive.infolist() if i.filename.startswith("site/"))


def run(smoke: bool = False) -> dict:
    from clouds.container import shared

    plans = [("aws", 1)] if smoke else [(c, n) for c in ("aws", "gcp", "azure") for n in (1, 2)]
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-cloud-submit-") as folder, ExitStack() as stack:
        work = Path(folder)
        image = shared()
        started = {}
        for cloud, nodes in plans:
            if cloud not in started:
                started[cloud] = {"aws": _aws, "gcp": _gcp, "azure": _azure}[cloud](stack, work, image)
            setup, runner = started[cloud]
            home = work / f"home-{cloud}-{nodes}"
            env = setup(home)
            for name, value in _measure(cloud, nodes, home, env, runner, work).items():
                figures[f"{cloud}_{nodes}node_{name}"] = value
    figures["trainmaster_package_bytes"] = _package_bytes()
    print_figures("submit --wait to the entrypoint's first line, strict fakes, default set-up", figures)
    return figures


if __name__ == "__main__":
    run(smoke="--smoke" in sys.argv)
