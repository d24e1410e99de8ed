"""The reference recipes learn, write result.json, and their example job specs are valid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainmaster.jobs import environment
from trainmaster.jobs.checkpoint import read_segment
from trainmaster.jobs.recipes import MODULES, get_recipe
from trainmaster.jobs.recipes import cli
from trainmaster.jobs.recipes.options import parse_options
from trainmaster.jobs.runtime import RuntimeSettings, run
from trainmaster.jobs.spec import load_spec
from repo_paths import ROOT

EXAMPLES = ROOT / "configs" / "examples"

# Learning thresholds (the CartPole-v1 maximum is 500; a random policy averages about 22).
DQN_MIN_RETURN = 120.0
PPO_MIN_RETURN = 150.0
LM_MAX_EXCESS_LOSS = 0.2  # nats above the chain's entropy rate (uniform guessing is ~1.6 nats above)


def _train(name: str, root: Path, seed: int, k: int = 25, **values) -> dict:
    recipe = get_recipe(name)
    settings = RuntimeSettings(job_id=name, output_dir=root / "out", checkpoint_dir=root / "ckpt", seed=seed, segment_steps=k)
    result = run(recipe, recipe.config(values), settings).result
    assert json.loads((root / "out" / "result.json").read_text()) == result
    assert Path(result["final_checkpoint"]).is_dir() and Path(result["final_weights"]).is_file()
    return result


@pytest.mark.parametrize("name", sorted(MODULES))
def test_example_job_specs_are_valid_and_run_their_recipe(name):
    loaded = load_spec(EXAMPLES / name / "job.yaml")
    argv = loaded.spec.argv
    assert argv[:3] == ["python", "-m", f"trainmaster.jobs.recipes.{MODULES[name]}"]
    recipe = get_recipe(name)
    config = parse_options(recipe, argv[3:], MODULES[name])
    assert config.steps % loaded.spec.checkpoint.segment_steps == 0


@pytest.mark.slow
def test_dqn_learns_cartpole(tmp_path):
    result = _train("dqn", tmp_path, seed=7, steps=10_000)
    assert result["mean_return_last_20"] >= DQN_MIN_RETURN, result


@pytest.mark.slow
def test_ppo_learns_cartpole_and_counts_its_steps(tmp_path):
    result = _train("ppo", tmp_path, seed=7, steps=20_000)
    assert result["mean_return_last_20"] >= PPO_MIN_RETURN, result
    assert result["global_step"] == 20_000 and result["updates"] == 20_000 // 256
    final = read_segment(Path(result["final_checkpoint"])).state.rest
    assert int(final["global_step"]) == int(final["runtime/step"]) == 20_000
    lines = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert all(line["global_step"] == line["step"] for line in lines)
    assert [line["global_step"] for line in lines] == sorted(line["global_step"] for line in lines)


@pytest.mark.slow
def test_tiny_lm_loss_approaches_the_entropy_rate(tmp_path):
    result = _train("tiny-lm", tmp_path, seed=7, steps=200)
    assert result["final_loss"] <= result["entropy_rate"] + LM_MAX_EXCESS_LOSS, result
    assert result["uniform_loss"] - result["entropy_rate"] > 1.0  # the task is far from trivial


def _job_env(root: Path) -> dict[str, str]:
    return environment.job_environment(job_id="cli", output_dir=root / "out", checkpoint_dir=root / "ckpt",
                                       seed=1, segment_steps=5, bundle_sha256="0" * 64)


def test_recipe_runs_as_a_module(tmp_path):
    command = [sys.executable, "-m", "trainmaster.jobs.recipes.tiny_lm", "--steps", "10", "--d-model", "16",
               "--heads", "2", "--seq-len", "8", "--batch-size", "2"]
    done = subprocess.run(command, env={**os.environ, **_job_env(tmp_path)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed == json.loads((tmp_path / "out" / "result.json").read_text())
    assert printed["steps"] == 10 and printed["n"] == 2 and printed["recipe"] == "tiny-lm"


def test_recipe_command_line_errors(tmp_path, monkeypatch, capsys):
    for key, value in _job_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    recipe = get_recipe("tiny-lm")
    assert cli.main(recipe, "tiny_lm", ["--steps", "7"]) == 1
    assert "multiple of the segment length" in capsys.readouterr().err
    for argv in (["--no-such-option", "1"], ["--steps", "-5"], ["--lr", "fast"]):
        with pytest.raises(SystemExit) as exit_:
            cli.main(recipe, "tiny_lm", argv)
        assert exit_.value.code == 2
