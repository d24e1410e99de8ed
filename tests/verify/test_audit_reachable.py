"""The replay audit is reachable from the CLI: a runtime job on local with `replay_audit: always` is audited
from the segments the backend kept (the attempt's checkpoints/, not the outputs), bit for bit."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trainmaster.broker import paths
from trainmaster.broker.cli import app

pytestmark = pytest.mark.slow

JOB = """\
name: dqn
entrypoint: python -m trainmaster.jobs.recipes.dqn --steps 300 --learning-starts 50 --batch-size 16 --buffer-size 500
seed: 4
checkpoint:
  segment_steps: 25
verification:
  replay_audit: {mode}
  challenge_segments: 4
"""


@pytest.mark.parametrize("mode", ["always", "auto"])
def test_a_trusted_runtime_job_is_audited_when_the_spec_says_always(tm_home, tmp_path, mode):
    (tmp_path / "job.yaml").write_text(JOB.format(mode=mode))
    out = CliRunner().invoke(app, ["submit", str(tmp_path / "job.yaml"), "--wait", "--json"])
    assert out.exit_code == 0, out.output
    job = json.loads(out.output[out.output.index("{"):])
    verdict = json.loads((paths.job_dir(job["id"]) / "verdict.json").read_text())
    if mode == "auto":  # trusted compute is not audited unless asked
        assert "replay" not in verdict["checks"]
        return
    assert verdict["checks"] == ["integrity", "safety", "replay", "outcome"], verdict
    replay = verdict["evidence"]["replay"]
    segments = [s["index"] for s in replay["segments"]]
    assert segments[0] == 0 and segments[-1] == 11 and len(segments) == 6  # first, last and q = 4 drawn
    assert all(s["r"] == 0 for s in replay["segments"])  # our own machine and build: bit for bit
    assert not (paths.job_dir(job["id"]) / "outputs" / "checkpoints").exists()  # read where the backend keeps them
