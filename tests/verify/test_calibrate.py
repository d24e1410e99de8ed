"""Calibration: the artifact's arithmetic and storage, measuring a job class, the spec → run mapping, the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch
import typer
from typer.testing import CliRunner

from trainmaster.broker.cli import calibrate as calibrate_cli
from trainmaster.jobs.spec import load_spec
from trainmaster.jobs.recipes import get_recipe
from trainmaster.verify.calibrate import CalibrationError, calibrate, calibrate_states, warm_state
from trainmaster.verify.calibration import (
    FIELD_FLOOR,
    CalibrationPoint,
    UncalibratedError,
    job_class,
    load_calibration,
    store_calibration,
)
from trainmaster.verify.recipe_run import NotReplayable, recipe_run

from audit_support import TINY_LM, train
from calibration_support import artifact, point
from repo_paths import ROOT, TESTS


def test_tau_is_the_geometric_mean_and_r_the_separation():
    p = point(25, honest=1e-4, cheat=0.1)
    assert p.honest_p99 == pytest.approx(1e-4, rel=0.01) and p.cheat_min == 0.1
    assert p.tau == pytest.approx(math.sqrt(p.honest_p99 * 0.1)) and p.separation == pytest.approx(0.1 / p.honest_p99)
    assert p.honest_p99 < p.tau < p.cheat_min
    assert p.update_floor == pytest.approx(5e-3) and p.margin_tol == 1e-4
    assert point(25, 1e-4, 0.1, margin=3e-5).margin_tol == pytest.approx(3e-4)
    assert point(25, honest=0.0, cheat=0.1).tau > 0  # an all-exact measurement still leaves a τ


def test_field_tolerances_sit_between_honest_and_the_mildest_cheat():
    p = CalibrationPoint.from_measurements(
        25, {"ulp": [1e-4]}, {"lr_x0.9": [2.0]}, [], [5.0],
        honest_fields={"moments": [5e-4, 1e-3], "target": [4e-3], "priority": [1e-9]},
        cheat_fields={"moments": [0.5, 0.4], "target": [1e-3]},
    )
    assert p.tau == pytest.approx(math.sqrt(1e-4 * 2.0))
    assert p.field_tolerance["moments"] == pytest.approx(math.sqrt(1e-3 * 0.4))  # the geometric mean
    assert p.field_tolerance["target"] == pytest.approx(4e-2)  # 10 × the honest maximum
    assert p.field_tolerance["priority"] == pytest.approx(p.tau)  # no cheat measured: at least τ
    low = CalibrationPoint.from_measurements(25, {"ulp": [1e-6]}, {"lr_x0.9": [0.1]}, [], [5.0], honest_fields={"quiet": [1e-9]})
    assert low.field_tolerance["quiet"] == FIELD_FLOOR  # never below 1 % of the segment's change
    assert p.update_ceiling == pytest.approx(50.0) and p.update_floor == pytest.approx(5e-3)


def test_broken_measurements_are_refused():
    with pytest.raises(ValueError, match="RNG"):
        point(10, 1e-4, 0.1, margin=math.inf)
    with pytest.raises(ValueError, match="inf"):
        CalibrationPoint.from_measurements(10, {"ulp": [math.inf]}, {"lr_x0.9": [0.1]}, [], [1.0])


def test_low_separation_warns_and_suggests_a_smaller_k():
    cal = artifact(point(10, 1e-4, 0.1), point(25, 1e-3, 0.1), point(50, 2e-2, 0.1))
    assert cal.recommended_k == 25
    (warning,) = cal.warnings()
    assert warning.startswith("k = 50: separation R = 5") and "use k = 25" in warning
    assert "try k ≤ 5" in artifact(point(10, 2e-2, 0.1)).warnings()[0]
    with pytest.raises(UncalibratedError, match="not calibrated for k = 100"):
        cal.tau(100)


def test_store_and_load(tmp_path):
    cal = artifact(point(10, 1e-4, 0.1))
    path = store_calibration(cal, tmp_path / "calibration")
    assert path.name == "tiny-lm-x.json" and json.loads(path.read_text())["format"] == "trainmaster-calibration-v1"
    assert load_calibration(tmp_path / "calibration", "tiny-lm-x") == cal
    with pytest.raises(UncalibratedError, match="not calibrated"):
        load_calibration(tmp_path / "calibration", "dqn-y")
    path.write_text("{}")
    with pytest.raises(UncalibratedError, match="unreadable"):
        load_calibration(tmp_path / "calibration", "tiny-lm-x")


def test_the_job_class_ignores_only_the_run_length():
    assert job_class("tiny-lm", TINY_LM) == job_class("tiny-lm", {**TINY_LM, "steps": 10_000})
    assert job_class("tiny-lm", TINY_LM) != job_class("tiny-lm", {**TINY_LM, "lr": 1e-6})
    assert job_class("tiny-lm", TINY_LM).startswith("tiny-lm-")


def test_calibrating_tiny_lm_measures_every_variant():
    cal = calibrate("tiny-lm", TINY_LM, ks=[5, 10], seeds=[0, 1], bases=1, warmup=20)
    assert [p.k for p in cal.points] == [5, 10] and [b.model_dump() for b in cal.bases] == [
        {"seed": 0, "step": 20}, {"seed": 1, "step": 20}
    ]
    for p in cal.points:
        assert set(p.honest_r) == {"threads", "ulp", "float64"} and all(len(v) == 2 for v in p.honest_r.values())
        assert p.separation >= 10 and 0 < p.min_update_per_lr <= p.max_update_per_lr
        assert p.update_ceiling == pytest.approx(10 * p.max_update_per_lr)
        assert "recent_losses" not in p.field_tolerance  # reported, within a fixed bound
    assert cal.job_class == job_class("tiny-lm", cal.config) and cal.environment["torch"]


def test_bases_span_the_run_from_where_learning_starts():
    dqn = {"steps": 120, "learning_starts": 45, "buffer_size": 200, "batch_size": 16}
    cal = calibrate("dqn", dqn, ks=[10], seeds=[0, 1], bases=3)
    # the first boundary on the 10-step grid whose steps update the weights, then spread to T − k = 110
    assert [(b.seed, b.step) for b in cal.bases] == [(0, 40), (0, 75), (0, 110), (1, 40), (1, 75), (1, 110)]
    (p,) = cal.points
    assert all(len(v) == 6 for v in p.honest_r.values())
    assert p.max_update_per_lr > p.min_update_per_lr and p.field_tolerance["optimizer/state/*/exp_avg"] >= p.tau


def test_bases_without_an_update_are_left_out_for_that_k():
    dqn = {"steps": 120, "learning_starts": 45, "buffer_size": 200, "batch_size": 16}
    run = train("dqn", dqn, 0, 10)
    cal = calibrate_states("dqn", [run.states[2], run.states[6]], ks=[10])  # steps 20..29 learn nothing
    assert all(len(v) == 1 for v in cal.points[0].honest_r.values())


def test_calibration_refuses_what_cannot_be_measured():
    with pytest.raises(CalibrationError, match="exceeds"):
        calibrate("tiny-lm", TINY_LM, ks=[50], seeds=[0], warmup=20)
    with pytest.raises(CalibrationError, match="no weight moves between step 10 and step 100"):
        calibrate("dqn", {"steps": 100, "learning_starts": 100}, ks=[10], seeds=[0], warmup=10)
    dqn = get_recipe("dqn")
    before_learning = warm_state(dqn, dqn.config({"steps": 100, "learning_starts": 90}), 0, 10)
    with pytest.raises(CalibrationError, match="updates no weight"):  # the only base is before learning starts
        calibrate_states(dqn, [before_learning], ks=[10])


def _spec(tmp_path, entrypoint: str, extra: str = ""):
    path = tmp_path / "job.yaml"
    path.write_text(f"name: lm\nentrypoint: {entrypoint}\nseed: 5\ncheckpoint:\n  segment_steps: 10\n{extra}")
    return path


def test_a_recipe_spec_maps_to_its_run(tmp_path):
    run = recipe_run(load_spec(_spec(tmp_path, "python -m trainmaster.jobs.recipes.tiny_lm --steps 60 --d-model 16 --heads 2")))
    assert (run.recipe.name, run.seed, run.k) == ("tiny-lm", 5, 10)
    assert run.config["d_model"] == 16 and run.config["steps"] == 60 and run.config["lr"] == 3e-3
    assert run.job_class == job_class("tiny-lm", run.config)


@pytest.mark.parametrize(
    ("entrypoint", "extra", "match"),
    [
        ("python train.py", "", "does not run a recipe"),
        ("python -m trainmaster.jobs.recipes.nope", "", "not a known recipe"),
        ("python -m trainmaster.jobs.recipes.tiny_lm --bogus 1", "", "does not take"),
        ("python -m trainmaster.jobs.recipes.tiny_lm --steps x", "", "invalid"),
        ("python -m trainmaster.jobs.recipes.tiny_lm --steps -3", "", "invalid"),
        ("python -m trainmaster.jobs.recipes.tiny_lm", "precision: bf16\n", "precision"),
    ],
)
def test_specs_that_cannot_be_replayed(tmp_path, entrypoint, extra, match):
    (tmp_path / "train.py").write_text("")
    with pytest.raises(NotReplayable, match=match):
        recipe_run(load_spec(_spec(tmp_path, entrypoint, extra)))


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("noop")(lambda: None)  # a group, as `trainmaster verify` is
    calibrate_cli.register(app)
    return app


def test_cli_calibrates_and_stores(tmp_path, tm_home):
    options = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in TINY_LM.items())
    spec = _spec(tmp_path, f"python -m trainmaster.jobs.recipes.tiny_lm {options}")
    result = CliRunner().invoke(_app(), ["calibrate", str(spec), "--k", "10", "--seeds", "2", "--bases", "2", "--warmup", "20", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    stored = tm_home / "calibration" / f"{payload['calibration']['job_class']}.json"
    assert payload["path"] == str(stored) and stored.is_file() and payload["spec_k"] == 10
    assert payload["recommended_k"] == 10 and payload["warnings"] == []


def test_cli_exit_codes(tmp_path, tm_home, monkeypatch):
    spec = _spec(tmp_path, "python -m trainmaster.jobs.recipes.tiny_lm --steps 60")
    poor = artifact(point(10, 2e-2, 0.1), name="tiny-lm-poor")
    monkeypatch.setattr("trainmaster.verify.calibrate.calibrate", lambda *a, **kw: poor)
    result = CliRunner().invoke(_app(), ["calibrate", str(spec), "--out", str(tmp_path / "cal")])
    assert result.exit_code == 1 and "try k ≤ 5" in result.output and (tmp_path / "cal" / "tiny-lm-poor.json").is_file()
    (tmp_path / "train.py").write_text("")
    other = _spec(tmp_path, "python train.py")
    assert CliRunner().invoke(_app(), ["calibrate", str(other)]).exit_code == 2
    assert CliRunner().invoke(_app(), ["calibrate", str(tmp_path / "missing.yaml")]).exit_code == 2


def test_a_few_ulps_of_divergence_are_forgiven_and_such_updates_not_calibrated():
    """The last steps of a schedule decaying to zero move weights by a few ulps; honest executors differ by one."""
    from trainmaster.verify.distance import MEASURABLE_ULPS, ROUNDING_ULPS, weight_distance

    start = {"w": torch.full((10_000,), 1.0)}
    up = torch.nextafter(start["w"], torch.full_like(start["w"], 2.0))
    replayed = {"w": torch.nextafter(up, torch.full_like(up, 2.0))}  # two ulps of update everywhere
    honest = {"w": up}  # one ulp off everywhere
    d = weight_distance(start, replayed, honest)
    assert d.r == 0 and d.raw_r == pytest.approx(0.5) and not d.measurable
    far = {"w": replayed["w"] + 1e-3}  # a thousand-odd ulps off
    assert weight_distance(start, replayed, far).r > 100
    big = {"w": start["w"] + 0.1}
    d = weight_distance(start, big, {"w": big["w"] + 1e-6})
    assert d.measurable and d.update / d.rounding > MEASURABLE_ULPS
    assert d.r == pytest.approx(max(0.0, d.divergence - ROUNDING_ULPS * d.rounding) / d.update)


def test_cli_calibrates_a_jobs_own_recipe_in_a_child_process(tmp_path, tm_home, monkeypatch):
    """`verify calibrate` for a spec's own `recipe:` imports it only in a child process, from its code bundled
    and extracted afresh, as its audit does; the calibration is stored under the job class its config makes."""
    import shutil
    import sys

    code = tmp_path / "job"
    shutil.copytree(TESTS / "gpu" / "gpt_job", code, ignore=shutil.ignore_patterns("__pycache__"))
    options = "--d-model 16 --heads 2 --layers 1 --seq-len 8 --batch-size 2 --vocab 8 --warmup 2"
    (code / "job.yaml").write_text(f"name: gpt\nentrypoint: python gpt.py --steps 40 {options}\nrecipe: gpt:RECIPE\n"
                                   "seed: 5\ncheckpoint:\n  segment_steps: 10\n")
    monkeypatch.delitem(sys.modules, "gpt", raising=False)  # an earlier test of this worker may have imported one
    result = CliRunner().invoke(_app(), ["calibrate", str(code / "job.yaml"), "--k", "10", "--seeds", "1", "--bases", "2",
                                         "--json"])
    assert result.exit_code in (0, 1), result.output
    payload = json.loads(result.stdout[result.stdout.index("{"):])
    calibration = payload["calibration"]
    assert calibration["recipe"] == "gpt" and (calibration["executor"], calibration["verifier"]) == ("cpu", "cpu")
    assert calibration["config"]["d_model"] == 16 and payload["spec_k"] == 10
    stored = tm_home / "calibration" / f"{calibration['job_class']}.json"
    assert payload["path"] == str(stored) and stored.is_file()
    assert "gpt" not in sys.modules  # never imported in the CLI's own process


def test_cli_own_recipe_errors_come_back_as_one_line(tmp_path, tm_home):
    code = tmp_path / "job"
    code.mkdir()
    (code / "broken.py").write_text("raise RuntimeError('the recipe module fails at import')\n")
    (code / "job.yaml").write_text("name: b\nentrypoint: python broken.py --steps 40\nrecipe: broken:RECIPE\n")
    result = CliRunner().invoke(_app(), ["calibrate", str(code / "job.yaml"), "--k", "10"])
    assert result.exit_code == 2
    assert "cannot be imported from its verified bundle: RuntimeError: the recipe module fails at import" in result.output
    assert "Traceback" not in result.output


def test_a_gpu_pair_needs_a_gpu(tmp_path, tm_home):
    spec = _spec(tmp_path, "python -m trainmaster.jobs.recipes.tiny_lm --steps 60")
    result = CliRunner().invoke(_app(), ["calibrate", str(spec), "--executor", "cuda"])
    assert result.exit_code == 2 and "needs a CUDA device" in result.output
    result = CliRunner().invoke(_app(), ["calibrate", str(spec), "--verifier", "tpu"])
    assert result.exit_code == 2 and "--verifier must be cpu or cuda" in result.output


def test_tf32_and_bf16_runtime_recipes_are_refused_at_submit_when_audited(tmp_path):
    from cli_run import tm

    job = tmp_path / "job"
    job.mkdir()
    for precision in ("tf32", "bf16"):
        spec = _spec(job, "python -m trainmaster.jobs.recipes.tiny_lm --steps 60",
                     f"precision: {precision}\nverification: {{replay_audit: always}}\n")
        done = tm("submit", str(spec), "--dry-run", home=tmp_path / "home")
        assert done.returncode == 1, done.stdout + done.stderr
        said = " ".join((done.stdout + done.stderr).split())
        assert f"precision: a runtime recipe at precision {precision} cannot be replay-audited" in said
    # not audited (our own compute, replay_audit: never): it runs
    spec = _spec(job, "python -m trainmaster.jobs.recipes.tiny_lm --steps 60",
                 "precision: tf32\nverification: {replay_audit: never}\n")
    assert tm("submit", str(spec), "--dry-run", home=tmp_path / "home").returncode == 0


def test_a_shipped_recipe_run_by_a_real_miner_is_audited_with_its_shipped_calibration(tmp_path, tm_home):
    """The shipped tiny-lm example, as a user submits it to a miner (`submit --wait` through the CLI, a real
    `trainmaster miner serve` process, a policy with no τ and nothing calibrated in this home): it no longer stops at
    "job class … is not calibrated"; the audit uses the calibration shipped with trainmaster and says so."""
    import shutil
    from pathlib import Path

    from miner_support import MinerProcess, make_wallet, shown, tm

    job = Path(shutil.copytree(ROOT / "configs" / "examples" / "tiny-lm", tmp_path / "job"))
    spec = job / "job.yaml"
    spec.write_text(spec.read_text().replace("--steps 400", "--steps 100"))  # the run's length is not its class
    policy = tmp_path / "policy.yaml"
    policy.write_text("name: tao\ndefault:\n  primary: bittensor\ntao_rate:\n  usd_per_tao: 400\n")
    wallets = tmp_path / "wallets"
    make_wallet(wallets, "broker")
    miner = MinerProcess(tmp_path / "miner", make_wallet(wallets, "miner"),
                         config={"prices": {"rao_per_gpu_hour": {"cpu": 2_000_000_000}}, "default_hours": 0.25}).start()
    try:
        (tm_home / "config").mkdir(parents=True, exist_ok=True)
        (tm_home / "config" / "backends.yaml").write_text(
            f"bittensor:\n  wallet:\n    name: broker\n    path: {wallets}\n  quote_timeout_s: 5\n"
            f"  miners:\n    - hotkey: {miner.hotkey}\n      url: {miner.url}\n")
        done = tm("submit", str(spec), "--policy", str(policy), "--wait", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        job_shown = shown(done)
        assert job_shown["state"] == "accepted", job_shown
        assert not (tm_home / "calibration").exists() or not any((tm_home / "calibration").iterdir())
        replay = json.loads((tm_home / "jobs" / job_shown["id"] / "verdict.json").read_text())["evidence"]["replay"]
        assert (replay["device"], replay["executor_device"], replay["calibration_pair"]) == ("cpu", "cpu", "cpu→cpu")
        told = tm("verify", "show", job_shown["id"])
        assert "replayed on cpu (executor trained on cpu; τ from the cpu→cpu calibration)" in told.stdout, told.stdout
    finally:
        miner.stop()
