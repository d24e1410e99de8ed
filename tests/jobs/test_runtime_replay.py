"""Re-executing one segment of each reference recipe: bit-exact, with forced decisions, and via the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainmaster.jobs.checkpoint import read_manifest, read_segment, segment_dir
from trainmaster.jobs.decisions import DecisionTrace, DecisionTraceError
from trainmaster.jobs.execution import StateError
from trainmaster.jobs.recipes import get_recipe
from trainmaster.jobs.replay import load_trace, replay_segment
from trainmaster.jobs.runtime import RuntimeSettings, run

SMALL = {
    "dqn": ({"steps": 200, "learning_starts": 50, "batch_size": 16, "buffer_size": 500}, 25),
    "ppo": ({"steps": 200, "rollout": 64, "minibatch": 32, "epochs": 2}, 25),
    "tiny-lm": ({"steps": 40, "d_model": 32, "heads": 2, "seq_len": 16, "batch_size": 4, "warmup": 5}, 10),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One short run of every recipe; returns each run's checkpoint dir."""
    dirs = {}
    for name, (values, k) in SMALL.items():
        root = tmp_path_factory.mktemp(name)
        recipe = get_recipe(name)
        settings = RuntimeSettings(job_id=name, output_dir=root / "out", checkpoint_dir=root / "ckpt", seed=11, segment_steps=k)
        run(recipe, recipe.config(values), settings)
        dirs[name] = root / "ckpt"
    return dirs


def _segments(name: str) -> list[int]:
    values, k = SMALL[name]
    n = values["steps"] // k
    return [0, 2, n - 1]  # segment 2 of dqn spans the start of learning, of ppo a rollout boundary


@pytest.mark.parametrize("name", sorted(SMALL))
def test_replay_reproduces_the_next_state_bit_for_bit(runs, name):
    k = SMALL[name][1]
    for i in _segments(name):
        replayed = replay_segment(name, segment_dir(runs[name], i), k)
        following = read_manifest(segment_dir(runs[name], i + 1))
        assert replayed.weights_sha256 == following.weights_sha256, f"segment {i}"
        assert replayed.state_rest_sha256 == following.files["rest.safetensors"].sha256, f"segment {i}"
        assert (replayed.start_step, replayed.end_step) == (i * k, (i + 1) * k)


@pytest.mark.parametrize("name", ["dqn", "ppo"])
def test_replay_with_the_executors_own_trace_forced_agrees_everywhere(runs, name):
    k, i = SMALL[name][1], 2
    replayed = replay_segment(name, segment_dir(runs[name], i), k, forced_decisions=segment_dir(runs[name], i))
    assert replayed.weights_sha256 == read_manifest(segment_dir(runs[name], i + 1)).weights_sha256
    report = replayed.decisions
    assert report.disagreements == 0 and report.compared >= k and report.by_name == {}


def _edited(trace: DecisionTrace, step: int, name: str, value: torch.Tensor) -> DecisionTrace:
    tensors = trace.to_tensors()
    tensors[f"step/{step:012d}/{name}"] = value
    return DecisionTrace.from_tensors(tensors)


def test_forced_decisions_report_where_the_verifier_disagrees_and_by_how_much(runs):
    ckpt, k = runs["dqn"], 25
    late = load_trace(segment_dir(ckpt, 5))  # steps 125..149; the last step's change cascades nowhere
    a_star = late.get(149, "a_star")
    flipped = _edited(late, 149, "a_star", torch.where(torch.arange(len(a_star)) == 3, 1 - a_star, a_star))
    replayed = replay_segment("dqn", segment_dir(ckpt, 5), k, forced_decisions=flipped)
    report = replayed.decisions
    assert report.by_name == {"a_star": 1}
    assert 0 < report.max_margin < math.inf and report.median_margin == report.max_margin
    assert replayed.weights_sha256 != read_manifest(segment_dir(ckpt, 6)).weights_sha256

    early = load_trace(segment_dir(ckpt, 0))  # epsilon is 1 at step 0: that action came from the step's RNG
    random_action = _edited(early, 0, "action", 1 - early.get(0, "action"))
    report = replay_segment("dqn", segment_dir(ckpt, 0), k, forced_decisions=random_action).decisions
    assert report.by_name == {"action": 1} and report.max_margin == math.inf


def test_a_trace_that_does_not_fit_the_segment_is_refused(runs):
    ckpt = runs["dqn"]
    with pytest.raises(DecisionTraceError, match="no decision"):
        replay_segment("dqn", segment_dir(ckpt, 4), 25, forced_decisions=segment_dir(ckpt, 3))
    trace = load_trace(segment_dir(ckpt, 4))
    out_of_range = _edited(trace, 100, "action", torch.tensor(7))
    with pytest.raises(DecisionTraceError, match="outside"):
        replay_segment("dqn", segment_dir(ckpt, 4), 25, forced_decisions=out_of_range)
    with pytest.raises(DecisionTraceError, match="unused"):
        replay_segment("dqn", segment_dir(ckpt, 4), 24, forced_decisions=trace)


def test_replay_checks_the_expected_recipe_and_config(runs):
    ckpt = runs["dqn"]
    with pytest.raises(StateError, match="recipe 'dqn'"):
        replay_segment("ppo", segment_dir(ckpt, 1), 25)
    config = json.loads(bytes(read_segment(segment_dir(ckpt, 1)).state.rest["runtime/config.json"].tolist()))
    assert replay_segment("dqn", segment_dir(ckpt, 1), 25, config=config).end_step == 50
    with pytest.raises(StateError, match="not the expected"):
        replay_segment("dqn", segment_dir(ckpt, 1), 25, config={**config, "lr": 0.0009})
    with pytest.raises(StateError, match="cannot replay"):
        replay_segment("dqn", segment_dir(ckpt, 7), 50)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainmaster.jobs.replay", *args], capture_output=True, text=True, timeout=120)


def test_replay_cli_in_a_fresh_process(runs, tmp_path):
    ckpt = runs["dqn"]
    done = _cli(str(segment_dir(ckpt, 3)), "--k", "25", "--out", str(tmp_path / "r"), "--recipe", "dqn", "--force-decisions")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert json.loads(done.stdout) == report
    following = read_manifest(segment_dir(ckpt, 4))
    assert report["weights_sha256"] == following.weights_sha256
    assert report["decisions"]["disagreements"] == 0
    assert (tmp_path / "r" / "weights.safetensors").read_bytes() == (segment_dir(ckpt, 4) / "weights.safetensors").read_bytes()
    assert (tmp_path / "r" / "decisions.safetensors").read_bytes() == (segment_dir(ckpt, 3) / "decisions.safetensors").read_bytes()

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "weights.safetensors").write_bytes((segment_dir(ckpt, 3) / "weights.safetensors").read_bytes())
    (broken / "rest.safetensors").write_bytes((segment_dir(ckpt, 3) / "rest.safetensors").read_bytes()[:-5])
    failed = _cli(str(broken), "--k", "25", "--out", str(tmp_path / "x"))
    assert failed.returncode == 1 and "not canonical" in failed.stderr
