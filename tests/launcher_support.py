"""Play a training service for the container launcher: a bundle where the service puts it, the service's variables
pointing at temp folders (SageMaker: a real /opt/ml of the instance, in a mount namespace, clouds/namespace.py),
and the real `python -m trainmaster.jobs.launcher` started as a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from clouds.namespace import in_instance

from trainmaster.jobs.bundle import build_bundle
from trainmaster.jobs.spec import JobSpec

TINY_LM = ("python -m trainmaster.jobs.recipes.tiny_lm --steps 50 --d-model 16 --layers 1 --seq-len 8 "
           "--batch-size 4 --warmup 5")
JOB_ENV = {"TRAINMASTER_JOB_ID": "job-launcher", "TRAINMASTER_SEED": "3", "TRAINMASTER_SEGMENT_STEPS": "25"}
TIMEOUT_S = 240


def make_bundle(root: Path, files: dict[str, str], entrypoint: str) -> tuple[Path, str]:
    """A bundle of `files` (name → text) with a spec running `entrypoint`, written in `root/bundle/`: its path
    and sha256."""
    code = root / "code"
    code.mkdir(parents=True, exist_ok=True)
    for name, text in {"README.txt": "a launcher test job\n", **files}.items():
        (code / name).write_text(text)
    spec = JobSpec.model_validate({"name": "launched", "entrypoint": entrypoint, "seed": 3,
                                   "checkpoint": {"segment_steps": 25}})
    info = build_bundle(code, spec.canonical_json(), root / "bundle")
    return info.path, info.sha256


def plan(service: str, entrypoint: str, sha256: str, **fields) -> str:
    """A launch plan as JSON, with the tiny job's variables (a bundle's sha256 among them)."""
    env = {**JOB_ENV, "TRAINMASTER_BUNDLE_SHA256": sha256, **fields.pop("env", {})}
    return json.dumps({"service": service, "entrypoint": entrypoint, "bundle_sha256": sha256, "env": env, **fields})


def sagemaker_instance(root: Path, channel: Path, *, hosts=("algo-1",), current: str = "algo-1") -> Path:
    """What SageMaker puts in an instance's /opt/ml, made under `root/opt_ml`: resourceconfig.json naming the hosts
    and this one, the bundle channel (the files of `channel`), the model, output and checkpoint folders."""
    opt_ml = root / "opt_ml"
    (opt_ml / "input" / "config").mkdir(parents=True, exist_ok=True)
    (opt_ml / "input" / "config" / "resourceconfig.json").write_text(json.dumps(
        {"current_host": current, "hosts": list(hosts), "network_interface_name": "eth0"}))
    shutil.copytree(channel, opt_ml / "input" / "data" / "bundle", dirs_exist_ok=True)
    for folder in ("model", "output", "checkpoints"):
        (opt_ml / folder).mkdir(exist_ok=True)
    return opt_ml


def environment(launch: str, service_env: dict[str, str], scratch: Path) -> dict[str, str]:
    scratch.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "TRAINMASTER_LAUNCH": launch, "TMPDIR": str(scratch), **service_env}


def _argv(opt_ml: Path | None, hosts) -> list[str]:
    argv = [sys.executable, "-m", "trainmaster.jobs.launcher"]
    return in_instance(argv, opt_ml, list(hosts)) if opt_ml is not None else argv


def launch(launch: str, service_env: dict[str, str], scratch: Path, timeout: float = TIMEOUT_S, *,
           opt_ml: Path | None = None, hosts=("algo-1",)) -> subprocess.CompletedProcess:
    """Run the launcher to its end (as an instance whose /opt/ml is `opt_ml`, when given); text output, never raises
    on its exit code."""
    return subprocess.run(_argv(opt_ml, hosts), capture_output=True, text=True,
                          env=environment(launch, service_env, scratch), timeout=timeout)


def start(launch: str, service_env: dict[str, str], scratch: Path, log: Path, *, opt_ml: Path | None = None,
          hosts=("algo-1",)) -> subprocess.Popen:
    """Start the launcher, its output into `log`."""
    with open(log, "wb") as out:
        return subprocess.Popen(_argv(opt_ml, hosts), stdout=out, stderr=subprocess.STDOUT,
                                env=environment(launch, service_env, scratch))


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def synced_log(sync: Path) -> str:
    """The job's log as node 0's launcher publishes it on an object-store mount: closed parts, by offset."""
    return "".join(p.read_text(errors="replace") for p in sorted((sync / "log").glob("*.log")))
