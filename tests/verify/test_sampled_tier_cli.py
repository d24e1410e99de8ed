"""The sampled tier through the user's path: `trainmaster submit --wait` on local with keep_every, the default tier
and tail draws; the verdict (`verify show`, `--json`) says which tier, which boundaries and chunks, and each check's
measurement against its bound. The backend re-makes the states it did not keep before it answers."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trainmaster.broker import paths
from trainmaster.broker.cli import app

pytestmark = pytest.mark.slow

JOB = """\
name: dqn
entrypoint: python -m trainmaster.jobs.recipes.dqn --steps 400 --learning-starts 50 --batch-size 16 --buffer-size 500
seed: 4
checkpoint:
  segment_steps: 20
  keep_every: 5
  max_disk_gb: 1
verification:
  replay_audit: always
  challenge_segments: 3
  tail_segments: 3
"""


def test_a_job_is_audited_in_the_sampled_tier_and_its_verdict_explains(tm_home, tmp_path):
    (tmp_path / "job.yaml").write_text(JOB)
    out = CliRunner().invoke(app, ["submit", str(tmp_path / "job.yaml"), "--wait", "--json"])
    assert out.exit_code == 0, out.output
    job = json.loads(out.output[out.output.index("{"):])
    verdict = json.loads((paths.job_dir(job["id"]) / "verdict.json").read_text())
    assert verdict["outcome"] == "accepted", verdict["reasons"]
    replay = verdict["evidence"]["replay"]
    assert replay["tier"] == "sampled"
    segments = [s["index"] for s in replay["segments"]]
    assert segments[0] == 0 and segments[-3:] == [17, 18, 19] and len(segments) == 7  # first, q = 3, the last L = 3
    found = replay["boundaries"]
    assert found["passed"] and found["boundaries"] == 21 and found["chunks"] >= 42
    checks = {m["check"] for m in found["measurements"]}
    assert {"exact runtime/step", "weight movement / k-step bound", "second moments v_{s+1}/v_s"} <= checks
    assert all(m["passed"] for m in found["measurements"])
    shown = CliRunner().invoke(app, ["verify", "show", job["id"]])
    assert shown.exit_code == 0, shown.output
    assert "tier: sampled; replayed segments 0," in shown.output
    assert "boundaries: 21 opened and tied to the root" in shown.output
    assert "weight movement / k-step bound: 20/20 within bound" in shown.output
    as_json = json.loads(CliRunner().invoke(app, ["verify", "show", job["id"], "--json"]).output)
    assert as_json["evidence"]["replay"]["boundaries"]["measurements"]
