"""The GPU check's parts that need no GPU: `./dev gpu-check` refuses cleanly without one, and its stages run
end to end as a CPU rehearsal (tests/gpu/check.py --rehearse), so the check a GPU session runs in one go
does not stop at its first line there."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from repo_paths import ROOT


pytestmark = pytest.mark.slow


def test_without_a_gpu_the_check_refuses_and_runs_nothing(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPU_CHECK_PYTHON": sys.executable}
    done = subprocess.run([str(ROOT / "dev"), "gpu-check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    said = done.stdout + done.stderr  # (the script tees its output into $OUT/gpu-check.log)
    assert "sees no CUDA device" in said and "nothing was run" in said
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gpu-check.log"]
    # and the Python side says so too when started by hand
    direct = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu" / "check.py"), "--out", str(tmp_path / "o2")],
                            capture_output=True, text=True, timeout=120)
    assert direct.returncode == 2 and "no CUDA device" in direct.stderr


@pytest.mark.timeout(1200)  # every stage of the check, small, on a loaded 2-core runner: past the suite's 300 s default
def test_the_check_runs_every_stage_as_a_cpu_rehearsal(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "gpu" / "check.py"), "--rehearse", "--recipes", "tiny-lm", "--lanes", "2",
         "--out", str(out), "--work", str(tmp_path / "work"), "--budget", "1500"],
        capture_output=True, text=True, timeout=1800,
    )
    summary = json.loads((out / "gpu-check.json").read_text())
    assert done.returncode == 0, json.dumps({k: v.get("error") for k, v in summary["stages"].items()}, indent=1)
    stages = summary["stages"]
    assert all(stage["status"] == "ok" for stage in stages.values()), stages
    assert stages["gpt_submit"]["state"] == "accepted" and stages["gpt_submit"]["replay"]["tau_source"] == "exact"
    assert stages["gpt_resume"]["bit_exact"] is True
    assert stages["shipped_submits"]["tiny-lm"]["state"] == "accepted"
    assert stages["cpu_audits"]["tiny-lm"]["false_rejects"] == 0 and stages["cpu_audits"]["tiny-lm"]["audited"] >= 1
    assert "tiny-lm cpu→cpu" in stages["calibrations"] and (out / "calibrations.tar").is_file()
    assert "r" in stages["gpt_cpu_audit"] or "segment" in stages["gpt_cpu_audit"]
    assert summary["figures"]["gpt_benchmark"]["blocked fraction of step time (%)"] >= 0
    calibrated = stages["gpt_calibration"]  # the job's own recipe: cpu→cpu here, cuda→cuda on a GPU
    assert calibrated["pair"] == "cpu→cpu" and calibrated["cheat_min"] > calibrated["tau"] > calibrated["honest_p99"]
    assert calibrated["calibration"]["recipe"] == "gpt" and calibrated["calibration"]["executor"] == "cpu"
    # ``--lanes 2`` (how a 15-minute device lease fits the check): the shipped recipe's stages ran in a second
    # process and came back into the one summary, the calibrations beside it
    assert {name for name, stage in stages.items() if stage.get("lane") == "b"} == {"shipped_submits", "cpu_audits",
                                                                                     "cross_device_audits", "calibrations"}
    crossed = stages["cross_device_audits"]["tiny-lm"]  # one direct run, every segment audited in a process pool
    assert crossed["audited"] == crossed["segments"] == 4 and crossed["false_rejects"] == 0, crossed
    assert crossed["pair"] == "cpu→cpu" and crossed["audited_with_an_update"] == 4  # the rehearsal's executor: a CPU
    assert "[lane b]" in done.stdout and "lane b ended (exit 0)" in done.stdout
    assert stages["shipped_submits"]["tiny-lm"]["timeline"][-1].endswith("accepted")
    # at most 8 files come back from a device run
    assert sorted(p.name for p in out.iterdir()) == ["calibrations.tar", "gpu-check.json", "lane-b"]
    assert sorted(p.name for p in (out / "lane-b").iterdir()) == ["gpu-check.json", "lane.log"]


@pytest.mark.parametrize("sizes", ["GPU", "REHEARSAL"])
def test_every_run_the_check_makes_is_one_its_recipe_accepts(sizes):
    """A size the runtime refuses (PPO at 4,096 steps is not a multiple of k = 25) would fail the stage on the one
    device lease a session gets: every run's steps and the GPT options are checked here, where it costs nothing."""
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    sys.path.insert(0, str(ROOT / "tests" / "gpu" / "gpt_job"))
    import check
    from gpt import RECIPE as GPT

    from trainmaster.jobs.recipes import get_recipe
    from trainmaster.jobs.recipes.options import parse_options

    chosen = getattr(check, sizes)
    for module, name in check.RECIPES.items():
        for steps in (chosen.shipped_steps[module], chosen.calibration_steps[module]):
            assert steps % check.K == 0, (name, steps)
            assert get_recipe(name).config({"steps": steps}).steps == steps
    config = parse_options(GPT, check.gpt_options(chosen, chosen.gpt_steps))
    assert config.steps % check.K == 0 and config.steps // check.K >= 2  # gpt_resume waits for the state S_2


def test_the_cpu_audits_audit_a_direct_run_when_no_submit_left_one(tmp_path):
    """On the H200 the DQN and PPO submits failed and nothing of theirs was audited on the CPU: without a submitted
    run, stage ``cpu_audits`` now audits a run the runtime makes directly, as an executor makes one."""
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "gpu" / "check.py"), "--rehearse", "--stages", "cpu_audits",
         "--run-recipes", "tiny-lm", "--out", str(out), "--work", str(tmp_path / "work"), "--budget", "600"],
        capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    audited = json.loads((out / "gpu-check.json").read_text())["stages"]["cpu_audits"]["tiny-lm"]
    assert audited["run"] == "direct run" and audited["audited"] >= 1 and audited["false_rejects"] == 0
