"""A training process killed with SIGKILL, and one whose disk fills up, in real subprocesses."""

from __future__ import annotations

import os
import random
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainmaster.jobs import environment
from trainmaster.jobs.checkpoint import read_segment, segment_dir, segment_indices
from trainmaster.jobs.commitment import read_commitment
from trainmaster.jobs.recipes import get_recipe
from trainmaster.jobs.runtime import RuntimeSettings, run

ARGS = ["--steps", "400", "--learning-starts", "50", "--batch-size", "16", "--buffer-size", "1000"]
CONFIG = {"steps": 400, "learning_starts": 50, "batch_size": 16, "buffer_size": 1000}
K, SEED = 25, 5

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run (in this process)."""
    root = tmp_path_factory.mktemp("reference")
    recipe = get_recipe("dqn")
    settings = RuntimeSettings(job_id="j", output_dir=root / "out", checkpoint_dir=root / "ckpt", seed=SEED, segment_steps=K)
    run(recipe, recipe.config(CONFIG), settings)
    return root


def _env(root: Path, resume: bool = False) -> dict[str, str]:
    job = environment.job_environment(
        job_id="j", output_dir=root / "out", checkpoint_dir=root / "ckpt", seed=SEED, segment_steps=K,
        bundle_sha256="0" * 64, resume_from=root / "ckpt" if resume else None,
    )
    return {**os.environ, **job}


def _train(root: Path, resume: bool = False, **popen) -> subprocess.Popen:
    command = [sys.executable, "-m", "trainmaster.jobs.recipes.dqn", *ARGS]
    return subprocess.Popen(command, env=_env(root, resume), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _assert_same_run(root: Path, reference: Path) -> None:
    assert read_commitment(root / "out" / "commitment.json") == read_commitment(reference / "out" / "commitment.json")
    assert (root / "out" / "metrics.jsonl").read_text() == (reference / "out" / "metrics.jsonl").read_text()


def test_killed_at_a_random_step_and_resumed_gives_the_uninterrupted_result(reference, tmp_path):
    rng = random.Random()
    wanted = rng.randint(2, 7)  # segments on disk before the kill; the run has 17
    process = _train(tmp_path)
    deadline = time.monotonic() + 120
    while len(segment_indices(tmp_path / "ckpt")) < wanted and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(rng.uniform(0, 0.05))  # somewhere inside a segment
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (tmp_path / "out" / "commitment.json").exists()
    survivors = segment_indices(tmp_path / "ckpt")
    assert survivors and survivors == list(range(len(survivors))) and len(survivors) < 17

    resumed = _train(tmp_path, resume=True)
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    _assert_same_run(tmp_path, reference)


def _file_size_limit(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit then fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_full_disk_while_checkpointing_is_a_clear_error_and_keeps_the_good_checkpoints(reference, tmp_path):
    fits = 3  # segments 0..2 fit under the limit; the rest file grows with the replay buffer
    limit = max(p.stat().st_size for p in segment_dir(reference / "ckpt", fits - 1).iterdir()) + 1
    process = _train(tmp_path, preexec_fn=_file_size_limit(limit))
    _, err = process.communicate(timeout=120)
    assert process.returncode == 1
    assert "could not write segment 3" in err and "File too large" in err and "Traceback" not in err
    assert segment_indices(tmp_path / "ckpt") == list(range(fits))
    leftovers = sorted(p.name for p in (tmp_path / "ckpt" / "segments").iterdir())
    assert leftovers == [f"{i:08d}" for i in range(fits)]  # no half-written temporary segment
    for i in range(fits):
        assert read_segment(segment_dir(tmp_path / "ckpt", i)).manifest == read_segment(segment_dir(reference / "ckpt", i)).manifest

    resumed = _train(tmp_path, resume=True)  # room again: carry on from the last good segment
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    _assert_same_run(tmp_path, reference)
