"""Azure end to end through the real CLI: `trainmaster submit --wait` under a policy whose primary is azure,
backends.yaml pointing at the strict Azure ML fake and Azurite, and a test-side runner playing Azure ML
(tests/clouds/azure_runner.py: the launcher in a subprocess per instance). A spot job preempted mid-run resumes
from its synced checkpoints to the bytes of an uninterrupted run, is fetched, verified and charged what the
service billed; a 2-node gloo job; throttling retried; capacity refused at submit falls back to local; a job
failing inside the service ends with the service's reason and the exit code."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from clouds.azure_runner import AzureMLRunner
from miner_support import shown, tm
from test_remote_harness import EVALUATOR, JOB, TINY_LM

pytest_plugins = ["clouds.conftest_azure"]
pytestmark = pytest.mark.slow

GLOO = """\
import os, pathlib
import torch.distributed as dist
import torch

dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1])
dist.all_reduce(total)
if dist.get_rank() == 0:
    pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"], "sum.txt").write_text(str(int(total)))
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {int(total)}", flush=True)
dist.destroy_process_group()
"""
FAILING = "import sys\nprint('about to fail', flush=True)\nsys.exit(3)\n"


@pytest.fixture
def cli(azure, azure_config, tm_home, tmp_path, monkeypatch):
    """backends.yaml and a policy (azure, falling back to local); the runner playing Azure ML meanwhile."""
    monkeypatch.setenv("PYTHONPATH", ":".join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")])))
    (tm_home / "config").mkdir(parents=True)
    section = {k: v for k, v in azure_config.model_dump(exclude_defaults=True).items()}
    (tm_home / "config" / "backends.yaml").write_text(json.dumps({"azure": {**section, "region": "eastus"}}))
    (tmp_path / "policy.yaml").write_text("name: az\ndefault:\n  primary: azure\n  fallbacks: [local]\n")
    with AzureMLRunner(azure, tmp_path / "service") as runner:
        yield runner


def job(tmp_path, entrypoint: str, *, name="lm", extra="", files=None):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "job.yaml").write_text(JOB.format(entrypoint=entrypoint) + extra)
    (folder / "evaluate.py").write_text(EVALUATOR)
    for file, text in (files or {}).items():
        (folder / file).write_text(text)
    return folder / "job.yaml"


def submit(spec, tmp_path) -> dict:
    done = tm("submit", str(spec), "--policy", str(tmp_path / "policy.yaml"), "--wait", "--json")
    return shown(done)


def rows(tm_home, sql, *args):
    db = sqlite3.connect(tm_home / "state.db")
    db.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in db.execute(sql, args).fetchall()]
    finally:
        db.close()


def test_probe(cli, azure, tm_home, tmp_path):
    spec = job(tmp_path, TINY_LM.format(steps=100))
    print(tm("offers", str(spec), "--policy", str(tmp_path / "policy.yaml"), "--json").stdout[:3000])
    out = submit(spec, tmp_path)
    print(json.dumps(out, indent=1)[:5000])
    for name in azure.fake.jobs:
        print(name, azure.fake.properties(name)["status"], azure.fake.properties(name).get("properties"))
    for f in sorted((tmp_path / "service").rglob("*.log")):
        print(f, f.read_text()[-2000:])
    assert False
