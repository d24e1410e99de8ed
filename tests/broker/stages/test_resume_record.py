"""`trainmaster resume` keeps the whole record: after `kill -9`, the resumed job's `metrics.jsonl` holds every
line (the earlier attempt's up to the resume step carried over, byte-identical to an uninterrupted run's), the
log and the command say from which step it resumed, `--max-hours` / `--max-usd` raise the job's limits, and a
job that does not train with trainmaster's runtime is told it restarts from scratch."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from typer.testing import CliRunner

from trainmaster.broker import paths
from trainmaster.broker.cli import app

STEPS, SEGMENT_STEPS = 80, 10
"""8 segments, killed after the third: what the record proves does not depend on the steps' count (each costs CPU
in the run, its resume and the runtime's self-check)."""
JOB = f"""\
name: lm
entrypoint: python -m trainmaster.jobs.recipes.tiny_lm --steps {STEPS} --d-model 32 --layers 1 --seq-len 16 --batch-size 8 --warmup 10
seed: 5
limits:
  max_hours: 1
checkpoint:
  segment_steps: {SEGMENT_STEPS}
"""


def cli(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def submitted(spec) -> str:
    result = cli("submit", spec, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["id"]


def wait_for(predicate, timeout: float = 240.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(0.1)


def state(job_id: str) -> str:
    return json.loads(cli("status", job_id, "--json").output)["state"]


def kill_after_segments(job_id: str, segments: int) -> None:
    """kill -9 the attempt's supervisor and its process group once `segments` segments are on disk."""
    workdir = paths.attempt_dir(job_id, 1)
    wait_for(lambda: len(list((workdir / "checkpoints" / "segments").glob("[0-9]*/manifest.json"))) >= segments
             or (workdir / "exit.json").exists())
    assert not (workdir / "exit.json").exists(), "the run ended before the kill"
    os.killpg(json.loads((workdir / "supervisor.json").read_text())["pid"], signal.SIGKILL)


@pytest.mark.slow
def test_resume_after_kill_9_keeps_every_metrics_line_says_where_and_raises_limits(tm_home, tmp_path):
    (tmp_path / "job.yaml").write_text(JOB)
    whole = cli("submit", tmp_path / "job.yaml", "--wait", "--json")
    assert whole.exit_code == 0, whole.output
    uninterrupted = (paths.job_dir(json.loads(whole.output)["id"]) / "outputs" / "metrics.jsonl").read_bytes()
    assert len(uninterrupted.splitlines()) == STEPS

    job_id = submitted(tmp_path / "job.yaml")
    kill_after_segments(job_id, 3)
    wait_for(lambda: state(job_id) == "failed")
    before = (paths.attempt_dir(job_id, 1) / "outputs" / "metrics.jsonl").read_bytes()
    assert 0 < len(before.splitlines()) < STEPS  # the first attempt's record is partial

    resumed = cli("resume", job_id, "--wait", "--json", "--max-hours", "2", "--max-usd", "5")
    assert resumed.exit_code == 0, resumed.output
    shown = json.loads(resumed.output[resumed.output.index("{"):])
    assert shown["state"] == "accepted" and [a["state"] for a in shown["attempts"]] == ["failed", "accepted"]
    point = shown["resumes_from"]
    assert point["attempt"] == 1 and point["step"] == SEGMENT_STEPS * point["segment"]
    assert point["step"] >= 2 * SEGMENT_STEPS
    assert (paths.job_dir(job_id) / "outputs" / "metrics.jsonl").read_bytes() == uninterrupted  # every line, as one run
    log = (paths.attempt_dir(job_id, 2) / "job.log").read_text()
    assert f"[trainmaster] resumed at step {point['step']} of {STEPS} from segment {point['segment']}" in log

    launch = json.loads((paths.attempt_dir(job_id, 2) / "launch.json").read_text())
    assert launch["max_seconds"] == 2 * 3600  # the raised limit is the one the resumed attempt runs under
    events = json.loads(cli("status", job_id, "--json").output)["events"]
    [limits] = [e for e in events if e["kind"] == "limits"]
    assert limits["detail"]["reason"] == "raised for the resume: max_hours 1 h → 2 h, max_usd none → $5.00"
    assert any(f"it resumes from step {point['step']}" in ((e["detail"] or {}).get("reason") or "") for e in events)


def test_a_job_without_runtime_checkpoints_is_told_it_restarts_from_scratch(tm_home, job_factory):
    job_id = submitted(job_factory("import sys\nsys.exit(3)\n", "limits:\n  max_hours: 1\n"))
    wait_for(lambda: state(job_id) == "failed", timeout=60)
    lowered = cli("resume", job_id, "--max-hours", "0.5")
    assert lowered.exit_code == 2 and "--max-hours 0.5 does not raise the job's max_hours (1 h)" in lowered.output
    resumed = cli("resume", job_id)
    assert resumed.exit_code == 0, resumed.output
    assert "it restarts from scratch" in resumed.output and "trainmaster's runtime" in resumed.output
    wait_for(lambda: state(job_id) == "failed", timeout=60)
    again = cli("resume", job_id, "--json")
    assert again.exit_code == 0 and json.loads(again.output)["resumes_from"] is None
    assert json.loads((paths.attempt_dir(job_id, 3) / "launch.json").read_text())["env"]["TRAINMASTER_RESUME_FROM"] == ""
