"""Real third-party training code as a job: Stable-Baselines3 trains PPO and saves its own `.zip` (cloudpickled
fields inside). On our own machine the run is accepted with the zip kept opaque (never loaded); a folder of
unknown origin holding it is refused unless `--trusted`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from trainmaster.broker import paths
from trainmaster.broker.cli import app

pytestmark = pytest.mark.slow

TRAIN = """\
import os, pathlib
from stable_baselines3 import PPO

model = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=1, seed=0, device="cpu", verbose=0)
model.learn(total_timesteps=64)
model.save(pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"]) / "ppo_cartpole")  # writes ppo_cartpole.zip
"""


def test_a_stable_baselines3_job_is_accepted_with_its_zip_opaque_and_refused_from_strangers(tm_home, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "job.yaml").write_text("name: sb3\nentrypoint: python train.py\n")
    out = CliRunner().invoke(app, ["submit", str(tmp_path / "job.yaml"), "--wait", "--json"])
    assert out.exit_code == 0, out.output
    job = json.loads(out.output[out.output.index("{"):])
    assert job["state"] == "accepted"
    [attempt] = job["attempts"]
    assert [o["path"] for o in attempt["opaque"]] == ["ppo_cartpole.zip"]
    outputs = paths.job_dir(job["id"]) / "outputs"
    env = {**os.environ, "TRAINMASTER_HOME": str(tm_home)}
    strict = subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "verify", str(outputs)],
                            capture_output=True, text=True, env=env)
    assert strict.returncode == 1 and "ppo_cartpole.zip" in strict.stdout + strict.stderr
    trusted = subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "verify", str(outputs), "--trusted"],
                             capture_output=True, text=True, env=env)
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr
