"""Commands import what they use: `ls` and `status` of ended jobs read the store without the service, the planner,
the backends or the spec models; `submit --help` imports no broker; `submit --dry-run` no numpy or torch.
Checked in a fresh interpreter per command (sys.modules after the command ran)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from import_probe import HEAVY, imported


@pytest.fixture
def ended_job(tm_home) -> str:
    from trainmaster.broker import paths
    from trainmaster.broker.store import Store

    store = Store(paths.state_db())
    store.create_job(job_id="done-1", name="done", workload="development", project=None, spec_json="{}",
                     spec_path="job.yaml", bundle_sha256="0" * 64, policy="default", policy_json="{}")
    store.move_job("done-1", "cancelled", reason="cancelled by the user")
    store.close()
    return "done-1"


@pytest.mark.parametrize("args", [["ls", "--all"], ["ls", "--all", "--json"], ["status", "done-1"],
                                  ["status", "done-1", "--json"]])
def test_reading_ended_jobs_imports_no_broker_machinery(ended_job, args):
    modules, out = imported(args)
    assert modules == [] and "done-1" in out


READS = [["ls"], ["ls", "--all", "--json"], ["status", "open-1"], ["status", "open-1", "--json"], ["spend"],
         ["spend", "--by", "backend", "--json"], ["verify", "show", "open-1"], ["executors", "ls"], ["models", "ls"]]
BACKENDS = ("trainmaster.backends.base", "trainmaster.backends.local.backend", "trainmaster.backends.registry",
            "trainmaster.broker.daemon.reconciler", "mlflow", "boto3", "aiohttp")


@pytest.mark.parametrize("args", READS, ids=[" ".join(a) for a in READS])
def test_a_read_with_an_unfinished_job_imports_no_backend_nor_the_scheduler(tm_home, ended_job, args):
    """Reads never write: with a job left to advance, a read imports neither the service, the planner, the
    backends nor the reconciler (the background pass it starts, broker/cli/background.py, runs them)."""
    from trainmaster.broker import paths
    from trainmaster.broker.store import Store

    store = Store(paths.state_db())
    store.create_job(job_id="open-1", name="open", workload="development", project=None, spec_json="{}",
                     spec_path="job.yaml", bundle_sha256="0" * 64, policy="default", policy_json="{}")
    store.close()
    modules, _ = imported(args, (*HEAVY, *BACKENDS))
    assert modules == [], f"{args}: {modules}"


@pytest.mark.parametrize("args", [["ls"], ["status", "done-1"], ["spend"]])
def test_the_reads_on_a_pipe_import_neither_typer_nor_rich(ended_job, args):
    modules, out = imported(args, ("typer", "rich", "rich.console", "pydantic", "click"))
    assert modules == [] and out


def test_submit_help_imports_no_broker(tm_home):
    modules, out = imported(["submit", "--help"])
    assert modules == [] and "--dry-run" in out


def test_submit_dry_run_imports_neither_numpy_nor_torch(tm_home, job_factory):
    spec = job_factory("print('hi')\n")
    modules, out = imported(["submit", str(spec), "--dry-run"], ("numpy", "torch", "trainmaster.verify.safeload"))
    assert modules == [] and "dry run, nothing submitted" in out


def test_status_of_an_accepted_job_reads_its_verdict_without_the_models(tm_home, job_factory):
    """An accepted job has a stored verdict: `status` shows its opaque and dropped files from the stored JSON,
    without importing pydantic's verdict model."""
    spec = job_factory("import os, pathlib\npathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'a.txt').write_text('x')\n")
    done = subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "submit", str(spec), "--wait", "--json"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    job_id = json.loads(done.stdout)["id"]
    modules, out = imported(["status", job_id, "--json"], (*HEAVY, "trainmaster.verify.verdict", "pydantic"))
    assert modules == [] and json.loads(out)["attempts"][0]["opaque"] == []


def test_verifying_plain_files_does_not_import_torch(tm_home, tmp_path):
    """The checks of a run without a checkpoint (integrity, safety: what every local `submit --wait` waits for in the
    audit pool's fresh worker) read the checkpoint layout's names without torch (jobs/segment_layout.py): importing
    torch there had cost each such verification seconds."""
    folder = tmp_path / "outputs"
    folder.mkdir()
    (folder / "model.txt").write_text("weights\n")
    modules, out = imported(["verify", "show", str(folder), "--trusted"],
                            ("torch", "trainmaster.verify.pipeline", "trainmaster.verify.record_limits"))
    assert "ACCEPTED" in out and "safety" in out, out
    assert modules == ["trainmaster.verify.pipeline", "trainmaster.verify.record_limits"], modules
