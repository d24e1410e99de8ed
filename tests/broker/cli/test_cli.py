"""The CLI as a user meets it: real subprocesses, real exit codes, --json everywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

TRAIN = "import os, pathlib\npathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'out.txt').write_text('ok')\nprint('hello from the job')\n"


def tm(*args: str, home, check: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRAINMASTER_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120, check=check)


@pytest.fixture
def home(tmp_path):
    return tmp_path / "home"


def test_submit_wait_streams_logs_and_exits_0(job_factory, home):
    spec = job_factory(TRAIN)
    out = tm("submit", str(spec), "--wait", home=home)
    assert out.returncode == 0, out.stderr
    assert "hello from the job" in out.stdout
    assert "accepted" in out.stdout and "outputs:" in out.stdout


def test_submit_json_then_status_ls_logs(job_factory, home):
    spec = job_factory(TRAIN)
    sub = json.loads(tm("submit", str(spec), "--json", home=home, check=True).stdout)
    job_id = sub["id"]
    logs = tm("logs", "-f", job_id[:-2], home=home, check=True)  # a unique prefix is enough
    assert "hello from the job" in logs.stdout
    status = json.loads(tm("status", job_id, "--json", home=home, check=True).stdout)
    assert status["state"] == "accepted"
    assert status["attempts"][0]["outputs"][0]["path"] == "out.txt"
    assert [e["to"] for e in status["events"] if e["kind"] == "transition"][-1] == "accepted"
    listed = json.loads(tm("ls", "--all", "--json", home=home, check=True).stdout)
    assert [j["id"] for j in listed] == [job_id]
    assert [j["state"] for j in json.loads(tm("ls", "--json", home=home, check=True).stdout)] == ["accepted"]  # just ended


def test_dry_run_prints_the_plan_and_submits_nothing(job_factory, home):
    spec = job_factory(TRAIN)
    out = tm("submit", str(spec), "--dry-run", "--json", home=home, check=True)
    plan = json.loads(out.stdout)
    assert plan["chosen"]["backend"] == "local" and len(plan["bundle"]["sha256"]) == 64
    assert plan["considered"][0]["verdict"] == "chosen"
    assert json.loads(tm("ls", "--all", "--json", home=home, check=True).stdout) == []
    human = tm("submit", str(spec), "--dry-run", home=home, check=True).stdout
    assert "Considered offers" in human and "chosen" in human


def test_exit_codes(job_factory, home, tmp_path):
    assert tm("submit", str(tmp_path / "nope.yaml"), home=home).returncode == 2
    bad = job_factory(TRAIN, "resources:\n  gpu: 1\n")
    out = tm("submit", str(bad), home=home)
    assert out.returncode == 1 and "did you mean 'gpus'" in out.stderr and "job.yaml:4" in out.stderr
    eight = job_factory(TRAIN, "resources:\n  gpus: 8\n")
    out = tm("submit", str(eight), home=home)
    assert out.returncode == 1 and "needs 8 GPU(s)" in out.stderr
    failing = job_factory("raise SystemExit(4)\n")
    assert tm("submit", str(failing), "--wait", home=home).returncode == 1
    assert tm("status", "no-such-job", home=home).returncode == 2


def test_cancel(job_factory, home):
    spec = job_factory("import time\ntime.sleep(120)\n")
    job_id = json.loads(tm("submit", str(spec), "--json", home=home, check=True).stdout)["id"]
    out = json.loads(tm("cancel", job_id, "--json", home=home, check=True).stdout)
    assert out["state"] == "cancelled"
    assert out["attempts"][0]["state"] == "cancelled"


def test_schema_job_is_json_schema(home):
    schema = json.loads(tm("schema", "job", home=home, check=True).stdout)
    assert schema["title"] == "trainmaster job" and "entrypoint" in schema["properties"]
    assert tm("schema", "nonsense", home=home).returncode == 2
