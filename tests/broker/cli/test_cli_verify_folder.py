"""`trainmaster verify DIR`, through the real CLI: nothing in the judged folder is run or read as configuration;
the outcome check is the one of the spec the user names (`--spec`), its evaluator run from a fresh bundle of
the user's code; a folder's own result.json or metrics.jsonl never satisfies a threshold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

NO_SPEC = "outcome not checked: no --spec given"

HOSTILE_EVALUATOR = """\
import pathlib
pathlib.Path({marker!r}).write_text("ran")
print('{{"accuracy": 1.0, "score": 1.0}}')
"""

HOSTILE_SPEC = """\
name: hostile
entrypoint: python evaluate.py
verification:
  evaluator: python evaluate.py
  thresholds: {accuracy: 0.5}
env:
  PYTHONSTARTUP: evaluate.py
"""

# the user's own evaluator: its score from the spec's env, and where it ran recorded for the test
USER_EVALUATOR = """\
import json, os, pathlib
assert pathlib.Path(os.environ["TRAINMASTER_EVAL_CHECKPOINT"]).is_file()
pathlib.Path(os.environ["RAN_IN"]).write_text(json.dumps({
    "cwd": os.getcwd(), "bundled_spec": pathlib.Path(".trainmaster/spec.json").is_file()}))
print(json.dumps({"score": float(os.environ["SCORE"])}))
"""


def verify(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "verify", *map(str, args)],
                          cwd=cwd, capture_output=True, text=True, env=os.environ.copy(), check=False)


def hostile_folder(root: Path, spec_at: str) -> tuple[Path, Path]:
    """A folder of outputs shipping a spec (at `spec_at`, relative to root) naming its own evaluator,
    which would leave a marker; returns (the folder, the marker)."""
    outputs, marker = root / "outputs", root / "marker"
    outputs.mkdir(parents=True)
    save_file({"w": torch.ones(3)}, str(outputs / "model.safetensors"))
    (outputs / "result.json").write_text(json.dumps({"accuracy": 1e300}))
    for folder in (outputs, root):
        (folder / "evaluate.py").write_text(HOSTILE_EVALUATOR.format(marker=str(marker)))
    (root / spec_at).write_text(HOSTILE_SPEC)
    return outputs, marker


@pytest.mark.parametrize("spec_at", ["outputs/job.yaml", "outputs/job.yml", "job.yaml"])
def test_a_folders_own_spec_and_evaluator_are_never_run(tm_home, tmp_path, spec_at):
    outputs, marker = hostile_folder(tmp_path / "judged", spec_at)
    done = verify(outputs, "--json", cwd=outputs)  # also where a relative `python evaluate.py` would find it
    assert done.returncode == 0, done.stdout + done.stderr
    verdict = json.loads(done.stdout)
    assert verdict["checks"] == ["integrity", "safety"]
    assert verdict["evidence"]["outcome"] == {"checked": False, "why": NO_SPEC}
    assert not marker.exists()


def test_a_trusted_folders_own_spec_is_never_run_either(tm_home, tmp_path):
    outputs, marker = hostile_folder(tmp_path / "judged", "outputs/job.yaml")
    done = verify(outputs, "--trusted", cwd=outputs.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ACCEPTED" in done.stdout and NO_SPEC in done.stdout
    assert not marker.exists()


def user_job(root: Path, *, threshold: float, score: float, ran_in: Path) -> Path:
    """The user's own code dir and spec (an evaluator, a threshold); returns the spec path."""
    root.mkdir(parents=True)
    (root / "train.py").write_text("")
    (root / "evaluate.py").write_text(USER_EVALUATOR)
    (root / "job.yaml").write_text(textwrap.dedent(f"""\
        name: mine
        entrypoint: python train.py
        env:
          SCORE: "{score}"
          RAN_IN: {json.dumps(str(ran_in))}
        verification:
          evaluator: python evaluate.py
          thresholds: {{score: {threshold}}}
    """))
    return root / "job.yaml"


@pytest.mark.parametrize("threshold, code, outcome", [(0.5, 0, "accepted"), (0.95, 1, "rejected")])
def test_spec_runs_the_users_evaluator_from_a_fresh_bundle(tm_home, tmp_path, threshold, code, outcome):
    outputs, marker = hostile_folder(tmp_path / "judged", "outputs/job.yaml")
    ran_in = tmp_path / "ran_in.json"
    spec = user_job(tmp_path / "mine", threshold=threshold, score=0.9, ran_in=ran_in)
    done = verify(outputs, "--spec", spec, "--json", cwd=outputs)
    assert done.returncode == code, done.stdout + done.stderr
    verdict = json.loads(done.stdout)
    assert verdict["outcome"] == outcome and verdict["checks"] == ["integrity", "safety", "outcome"]
    if outcome == "accepted":
        assert verdict["evidence"]["outcome"]["metrics"] == {"score": 0.9}
    else:
        assert "score = 0.9 is below the threshold 0.95" in verdict["reasons"][0]
    ran = json.loads(ran_in.read_text())
    assert ran["bundled_spec"]  # a bundle extracted afresh, not the user's tree nor the judged folder
    assert Path(ran["cwd"]) not in (spec.parent, outputs) and not Path(ran["cwd"]).exists()  # and removed after
    assert not marker.exists()


@pytest.mark.parametrize("claims", ["result.json", "metrics.jsonl"])
def test_self_reported_metrics_of_a_folder_cannot_pass_thresholds(tm_home, tmp_path, claims):
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    save_file({"w": torch.ones(3)}, str(outputs / "model.safetensors"))
    (outputs / "result.json").write_text(json.dumps({"accuracy": 1e300}))
    (outputs / "metrics.jsonl").write_text(json.dumps({"step": 1, "accuracy": 1e300}) + "\n")
    if claims == "metrics.jsonl":
        (outputs / "result.json").unlink()
    spec = tmp_path / "spec" / "job.yaml"
    spec.parent.mkdir()
    (spec.parent / "train.py").write_text("")
    spec.write_text("name: t\nentrypoint: python train.py\nverification:\n  thresholds: {accuracy: 0.5}\n")
    done = verify(outputs, "--spec", spec, "--json", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    verdict = json.loads(done.stdout)
    assert verdict["outcome"] == "cannot_verify"
    assert "self-reported metrics from untrusted outputs are not evidence" in verdict["reasons"][0]
    assert "give the spec an evaluator" in verdict["reasons"][0]


def test_spec_is_for_a_folder_and_must_be_valid(tm_home, tmp_path):
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    save_file({"w": torch.ones(3)}, str(outputs / "model.safetensors"))
    missing = verify(outputs, "--spec", tmp_path / "nope.yaml", cwd=tmp_path)
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: t\nentrypoint: python train.py\nverification:\n  evaluatr: x\n")
    invalid = verify(outputs, "--spec", bad, cwd=tmp_path)
    assert invalid.returncode == 2 and "bad.yaml" in invalid.stderr
    job = verify("train-0000", "--spec", bad, cwd=tmp_path)
    assert job.returncode == 2 and "--spec applies to a directory of outputs" in job.stderr


def test_modules_in_the_folder_are_never_imported_when_verifying_from_inside_it(tm_home, tmp_path):
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    save_file({"w": torch.ones(3)}, str(outputs / "model.safetensors"))
    marker = tmp_path / "imported"
    planted = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    for module in ("numpy.py", "safetensors.py", "torch.py", "trainmaster/__init__.py"):
        (outputs / module).parent.mkdir(exist_ok=True)
        (outputs / module).write_text(planted)
    script = Path(sys.executable).parent / "trainmaster"  # the installed command: it puts no cwd on sys.path
    done = subprocess.run([str(script), "verify", ".", "--json"], cwd=outputs, capture_output=True, text=True,
                          check=False)
    assert not marker.exists(), marker.read_text()
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["evidence"]["safety"]["safetensors_checked"] == {
        "model.safetensors": {"bytes": (outputs / "model.safetensors").stat().st_size, "tensors": 1}}
