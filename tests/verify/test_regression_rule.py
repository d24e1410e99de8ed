"""The 10 % no-regression rule runs: a job's outcome is compared with the metrics the broker measured for
the newest accepted earlier job of the same name (through `trainmaster submit --wait`)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from trainmaster.broker.cli import app

# a model file by hand (safetensors: 8-byte header length, JSON header, data), so the job needs no torch
MAKE_MODEL = """\
import json, os, pathlib, struct
out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
(out / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<f", 1.0))
"""
SPEC = "verification:\n  evaluator: python evaluate.py\n  thresholds:\n    score: 0.1\n"


def submit(spec, score: float) -> dict:
    """Submit the job with its evaluator scoring `score`; the job as it ended."""
    (spec.parent / "evaluate.py").write_text(f'import json\nprint(json.dumps({{"score": {score}}}))\n')
    result = CliRunner().invoke(app, ["submit", str(spec), "--wait", "--json"], env={"COLUMNS": "200"})
    return json.loads(result.output[result.output.index("{"):])


def test_a_run_that_regresses_more_than_10_percent_on_its_accepted_predecessor_is_rejected(tm_home, job_factory):
    spec = job_factory(MAKE_MODEL, SPEC, name="reg")
    assert submit(spec, 0.9)["state"] == "accepted"  # its first run: nothing to regress from
    worse = submit(spec, 0.5)  # above the threshold 0.1, but far below the accepted 0.9
    assert worse["state"] == "failed"
    [attempt] = worse["attempts"]
    assert attempt["state"] == "rejected"
    assert "score = 0.5 regressed below 90% of the previous accepted 0.9" in attempt["reason"], attempt["reason"]
    assert submit(spec, 0.85)["state"] == "accepted"  # within 10 % of the accepted 0.9 (the rejected run is no predecessor)
    assert submit(spec, 0.78)["state"] == "accepted"  # 0.85 is now the predecessor: 0.78 ≥ 0.765
