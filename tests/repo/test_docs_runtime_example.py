"""The "Writing a training script" example of docs/runtime.md, as written, passes its own replay audit.

The test takes the page's Python and YAML blocks of that section verbatim, writes them as `train.py`
and `job.yaml`, and runs `trainmaster submit --wait` (the real CLI, in a subprocess) with the spec's
`replay_audit: always`: the run trains, self-checks, commits, and the broker re-executes its segments.
"""

from __future__ import annotations

import json
import re

import pytest

from cli_run import tm
from repo_paths import ROOT

pytestmark = pytest.mark.slow

DOC = ROOT / "docs" / "runtime.md"


def _section_blocks(title: str) -> dict[str, list[str]]:
    text = DOC.read_text()
    start = text.index(f"## {title}\n")
    end = text.index("\n## ", start + 1)
    blocks: dict[str, list[str]] = {}
    for language, body in re.findall(r"```(\w+)\n(.*?)```", text[start:end], flags=re.S):
        blocks.setdefault(language, []).append(body)
    return blocks


def test_the_documented_recipe_is_accepted_by_its_own_replay_audit(tmp_path):
    blocks = _section_blocks("Writing a training script")
    [script] = blocks["python"]
    [spec] = blocks["yaml"]
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text(script)
    (job / "job.yaml").write_text(spec)
    assert "StateRules" in script and "replay_audit: always" in spec
    done = tm("submit", str(job / "job.yaml"), "--wait", "--json", home=tmp_path / "home", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    finished = json.loads(done.stdout[done.stdout.index("{"):])
    assert finished["state"] == "accepted", finished
    [job_dir] = (tmp_path / "home" / "jobs").iterdir()
    verdict = json.loads((job_dir / "verdict.json").read_text())
    assert verdict["outcome"] == "accepted" and "replay" in verdict["checks"], verdict["reasons"]
    replay = verdict["evidence"]["replay"]
    assert replay["passed"] and replay["tau_source"] == "exact"  # our own backend: every bit reproduced
    assert replay["device"] == "cpu" and replay["executor_device"] == "cpu"
    assert [s["index"] for s in replay["segments"]] == [0, 1, 2, 3]
    assert all(s["exact_compared"] and not s["exact_mismatches"] for s in replay["segments"])
