"""Play a training service for the container launcher: a bundle where the service puts it, the service's variables
pointing at temp folders, and the real `python -m trainmaster.jobs.launcher` started as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


def sagemaker_env(root: Path, channel: Path, *, hosts=("algo-1",), current: str = "algo-1") -> dict[str, str]:
    """What SageMaker sets, under `root` (its /opt/ml): the bundle channel, the model dir, the hosts."""
    return {"SM_CHANNEL_BUNDLE": str(channel), "TRAINMASTER_OPT_ML": str(root / "opt_ml"),
            "SM_MODEL_DIR": str(root / "opt_ml" / "model"), "SM_HOSTS": json.dumps(list(hosts)),
            "SM_CURRENT_HOST": current}


def environment(launch: str, service_env: dict[str, str], scratch: Path) -> dict[str, str]:
    scratch.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "TRAINMASTER_LAUNCH": launch, "TMPDIR": str(scratch), **service_env}


def launch(launch: str, service_env: dict[str, str], scratch: Path, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run the launcher to its end; text output, never raises on its exit code."""
    return subprocess.run([sys.executable, "-m", "trainmaster.jobs.launcher"], capture_output=True, text=True,
                          env=environment(launch, service_env, scratch), timeout=timeout)


def start(launch: str, service_env: dict[str, str], scratch: Path, log: Path) -> subprocess.Popen:
    """Start the launcher, its output into `log`."""
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "trainmaster.jobs.launcher"], stdout=out,
                                stderr=subprocess.STDOUT, env=environment(launch, service_env, scratch))


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())
