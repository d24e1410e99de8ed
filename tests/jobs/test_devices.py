"""The runtime on any device, as far as a machine without a GPU can tell (the GPU half: tests/gpu/check.py).

Device options and the verifier's override (jobs/devices.py), the device kind a run commits to
(jobs/commitment.py), host copies (jobs/host_copy.py), masks that are the same bits on every device
(jobs/hash_dropout.py), the self-check telling a step that is not deterministic from a state that misses
something (jobs/selfcheck.py), and the verifier's choice of device and calibration
(verify/verifier_device.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainmaster.jobs import devices
from trainmaster.jobs.canonical import serialize
from trainmaster.jobs.checkpoint import read_manifest, segment_dir
from trainmaster.jobs.commitment import Commitment, CommitmentError, build_commitment, read_commitment
from trainmaster.jobs.hash_dropout import DropoutKeys, HashDropout, hash_dropout, keep_mask
from trainmaster.jobs.host_copy import DeviceCopier
from trainmaster.jobs.runtime import RuntimeSettings, run
from trainmaster.jobs.selfcheck import MESSAGE, NONDETERMINISTIC
from trainmaster.jobs.state import TrainState
from trainmaster.jobs.writer import SerializedState
from trainmaster.verify.calibration import UncalibratedError, job_class
from trainmaster.verify.verifier_device import AUDIT_DEVICE_ENV, choose
from repo_paths import ROOT, TESTS

GPT_DIR = TESTS / "gpu" / "gpt_job"
SMALL_GPT = ["--d-model", "32", "--heads", "4", "--layers", "2", "--seq-len", "16", "--batch-size", "4",
             "--vocab", "16", "--warmup", "4"]


# device options


def test_auto_is_the_cpu_without_a_gpu_and_cuda_asked_for_is_a_clear_error():
    assert devices.resolve_device("auto") == torch.device("cpu") == devices.resolve_device("cpu")
    with pytest.raises(devices.DeviceError, match="sees no CUDA device"):
        devices.resolve_device("cuda")
    with pytest.raises(devices.DeviceError, match="not one of auto, cpu, cuda"):
        devices.resolve_device("tpu")


def test_a_replay_resolves_every_option_to_the_verifiers_device():
    with devices.replaying_on("cpu"):
        assert devices.resolve_device("cuda") == torch.device("cpu")  # a GPU executor's state, a CPU verifier
        assert devices.replay_kind() == "cpu"
    assert devices.replay_kind() is None
    with pytest.raises(devices.DeviceError, match="no CUDA device"):
        with devices.replaying_on("cuda"):
            pass


def test_the_shipped_recipes_take_a_device_option_that_is_not_part_of_their_job_class():
    from trainmaster.jobs.recipes import get_recipe
    from trainmaster.jobs.recipes.options import parse_options

    for name in ("dqn", "ppo", "tiny-lm"):
        recipe = get_recipe(name)
        auto, cpu = parse_options(recipe, []), parse_options(recipe, ["--device", "cpu"])
        assert auto.device == "auto" and cpu.device == "cpu"
        assert job_class(name, auto.model_dump(mode="json")) == job_class(name, cpu.model_dump(mode="json"))


def test_a_recipe_asked_for_cuda_on_a_machine_without_one_exits_1_with_the_reason(tmp_path):
    import subprocess
    import sys

    env = {"TRAINMASTER_OUTPUT_DIR": str(tmp_path / "out"), "TRAINMASTER_SEGMENT_STEPS": "5", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "trainmaster.jobs.recipes.tiny_lm", "--steps", "10", "--device", "cuda"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "device cuda was asked for, but this process sees no CUDA device" in done.stderr


# what a run commits to


def test_a_cpu_commitment_has_no_device_and_a_gpu_one_says_cuda_in_its_signed_bytes():
    fields = dict(job_id="j", bundle_sha256="a" * 64, root="b" * 64, final_sha256="c" * 64, n=4, k=25)
    cpu, gpu = Commitment(**fields), Commitment(**fields, device="cuda")
    assert b"device" not in cpu.canonical_json() and cpu.device_kind == "cpu"
    assert b'"device":"cuda"' in gpu.canonical_json() and gpu.device_kind == "cuda"
    assert Commitment.from_json(gpu.canonical_json()) == gpu
    for spelled in (b'"device":null,', b'"device":"cpu",', b'"device":"tpu",'):
        forged = cpu.canonical_json().replace(b'"bundle_sha256"', spelled + b'"bundle_sha256"')
        with pytest.raises(CommitmentError):
            Commitment.from_json(forged)


def test_the_commitment_says_cuda_when_any_segment_was_trained_on_a_gpu(tmp_path):
    from trainmaster.jobs.recipes.tiny_lm import RECIPE

    settings = RuntimeSettings(output_dir=tmp_path / "out", checkpoint_dir=tmp_path / "ckpt", segment_steps=5)
    config = RECIPE.config({"steps": 10, "d_model": 16, "layers": 1, "seq_len": 8, "batch_size": 2, "warmup": 2})
    result = run(RECIPE, config, settings)
    assert result.commitment.device is None and read_manifest(segment_dir(tmp_path / "ckpt", 1)).device is None
    # a segment trained on a GPU (after a resume, say) records it in its manifest; the commitment carries it
    manifest = segment_dir(tmp_path / "ckpt", 1) / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "device": "cuda"}))
    again = build_commitment(tmp_path / "ckpt", job_id="local", bundle_sha256="0" * 64, n=2, k=5)
    assert again.device == "cuda" and again.root == result.commitment.root  # the leaves are the same bytes


# host copies


def test_host_copies_are_the_canonical_bytes():
    state = TrainState(weights={"b": torch.arange(6.0).reshape(2, 3).t(), "a": torch.tensor(True)},
                       rest={"x": torch.zeros(0, dtype=torch.bfloat16), "n": torch.tensor(7)})
    copier = DeviceCopier()
    for part in (state.weights, state.rest):
        copy = copier.copy(part)
        copy.wait()
        assert bytes(copy.view) == serialize(part)
        assert copier.give_back(copy.view) and not copier.give_back(b"not one of them")
    captured = SerializedState.of(state)
    captured.wait()
    assert (bytes(captured.weights), captured.device) == (serialize(state.weights), "cpu")
    assert state.on_host().weights.keys() == {"a", "b"}


# masks that are the same bits on every device


def test_hash_dropout_masks_are_a_pure_function_of_key_and_position():
    # pinned bits: a GPU computes these same integers (exact int64 arithmetic), so a CPU verifier reproduces its masks
    assert keep_mask((12,), 0.5, 2**40 + 12345, "cpu").int().tolist() == [0, 0, 1, 1, 1, 0, 1, 0, 0, 1, 1, 1]
    mask = keep_mask((200_000,), 0.1, 7, "cpu")
    assert abs(mask.float().mean().item() - 0.9) < 0.003
    assert torch.equal(mask, keep_mask((200_000,), 0.1, 7, "cpu")) and not torch.equal(mask, keep_mask((200_000,), 0.1, 8, "cpu"))
    x = torch.randn(4, 5)
    out = hash_dropout(x, 0.1, 7)
    kept = keep_mask(x.shape, 0.1, 7, "cpu")
    assert torch.equal(out[~kept], torch.zeros(int((~kept).sum()))) and torch.allclose(out[kept], x[kept] / 0.9)
    keys = DropoutKeys()
    keys.start(1, 5)
    first = [keys.next(), keys.next()]
    keys.start(1, 5)
    assert [keys.next(), keys.next()] == first and first[0] != first[1]  # each call of a step its own mask
    layer = HashDropout(0.5, keys).eval()
    assert layer(x) is x


# the self-check on a GPT-style recipe (the false alarm of the 86M model), and what it says when a step is
# not deterministic


def _gpt_job(tmp_path, *, noisy: bool = False) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    source = (GPT_DIR / "gpt.py").read_text()
    if noisy:  # a step that reads the clock: no state() could capture it
        source = source.replace("        loss.backward()\n",
                                "        loss.backward()\n        self.model.head.bias.grad += (time.perf_counter_ns() % 7) * 1e-7\n")
        source = source.replace("import math\n", "import math\nimport time\n")
    (code / "gpt.py").write_text(source)
    return code


def _run_gpt(code: Path, out: Path, steps: int = 8) -> tuple[int, str]:
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRAINMASTER_OUTPUT_DIR": str(out), "TRAINMASTER_SEGMENT_STEPS": "4", "TRAINMASTER_SEED": "3"}
    done = subprocess.run([sys.executable, "gpt.py", "--steps", str(steps), *SMALL_GPT], cwd=code, env=env,
                          capture_output=True, text=True, timeout=300)
    return done.returncode, done.stderr


def test_a_gpt_style_recipe_with_layernorm_biases_adamw_and_dropout_passes_its_self_check(tmp_path):
    code, out = _gpt_job(tmp_path), tmp_path / "out"
    status, stderr = _run_gpt(code, out)
    assert status == 0, stderr
    assert read_commitment(out / "commitment.json").n == 2


def test_a_step_that_is_not_deterministic_is_named_so_not_blamed_on_state(tmp_path):
    code, out = _gpt_job(tmp_path, noisy=True), tmp_path / "out"
    status, stderr = _run_gpt(code, out)
    assert status == 1, stderr
    assert NONDETERMINISTIC in stderr and MESSAGE not in stderr
    # the clock's noise enters head.bias's gradient and spreads from the step it first differs: which entries are
    # named first depends on that step, so the message is checked for naming some, not one in particular
    named = stderr.split(f"{NONDETERMINISTIC}: ", 1)[1]
    assert named.strip() and ("head." in named or " more" in named), stderr
    assert not (out / "commitment.json").exists()


def test_a_hidden_cursor_is_still_blamed_on_state(tmp_path):
    code, out = _gpt_job(tmp_path), tmp_path / "out"
    source = (code / "gpt.py").read_text()
    source = source.replace("        self.keys.start(ctx.seed, ctx.step)\n",
                            "        self.keys.start(ctx.seed, ctx.step + self.calls)\n        self.calls += 1\n")
    source = source.replace("        self.recent: list[float] = []\n", "        self.recent: list[float] = []\n        self.calls = 0\n", 1)
    (code / "gpt.py").write_text(source)
    status, stderr = _run_gpt(code, out)
    assert status == 1 and MESSAGE in stderr and NONDETERMINISTIC not in stderr, stderr


# the verifier's device and calibration


def test_a_gpu_executor_is_audited_on_this_cpu_with_the_cpu_calibration_standing_in(tmp_path, monkeypatch):
    from calibration_support import artifact, point

    monkeypatch.delenv(AUDIT_DEVICE_ENV, raising=False)
    directory = tmp_path / "cal"
    from trainmaster.verify.calibration import store_calibration

    store_calibration(artifact(point(25, 1e-5, 0.1), name="gpt-x"), directory)
    choice = choose("cuda", "gpt-x", calibration_dir=directory)
    assert (choice.device, choice.pair, choice.calibration.pair) == ("cpu", "cuda→cpu", "cpu→cpu")
    assert "stands in for cuda→cpu" in choice.note
    measured = artifact(point(25, 2e-5, 0.1), name="gpt-x").model_copy(update={"executor": "cuda"})
    store_calibration(measured, directory)
    assert (directory / "gpt-x.cuda-cpu.json").is_file()
    choice = choose("cuda", "gpt-x", calibration_dir=directory)
    assert choice.calibration.pair == "cuda→cpu" and choice.note is None
    assert choose("cpu", "gpt-x", calibration_dir=directory).calibration.pair == "cpu→cpu"
    # a trusted exact replay of a GPU run needs a GPU; an operator's wish for one it does not have is said
    with pytest.raises(UncalibratedError, match="bit for bit on a GPU"):
        choose("cuda", "gpt-x", calibration_dir=directory, exact=True)
    monkeypatch.setenv(AUDIT_DEVICE_ENV, "cuda")
    with pytest.raises(UncalibratedError, match="sees no CUDA device"):
        choose("cpu", "gpt-x", calibration_dir=directory)
    monkeypatch.setenv(AUDIT_DEVICE_ENV, "gpu")
    with pytest.raises(UncalibratedError, match="not one of auto, cpu, cuda"):
        choose("cpu", "gpt-x", calibration_dir=directory)


def test_the_shipped_recipes_come_calibrated_at_their_shipped_configs(tmp_path):
    from trainmaster.jobs.spec import load_spec
    from trainmaster.verify.calibration import calibration_for_pair
    from trainmaster.verify.recipe_run import recipe_run

    examples = ROOT / "configs" / "examples"
    for name in ("dqn", "ppo", "tiny-lm"):
        run = recipe_run(load_spec(examples / name / "job.yaml"))
        for executor in ("cpu", "cuda"):  # a miner's GPU run is audited on this CPU
            calibration = calibration_for_pair(tmp_path / "none", run.job_class, executor, "cpu")
            assert calibration.job_class == run.job_class and calibration.point(run.k).separation >= 10
            assert calibration.pair == f"{executor}→cpu"  # the GPU pairs were measured, none stands in
        for verifier in ("cpu", "cuda"):  # measured on an H200 (tests/gpu/check.py): the GPU and versions recorded
            measured = calibration_for_pair(tmp_path / "none", run.job_class, "cuda", verifier)
            assert measured.pair == f"cuda→{verifier}" and measured.environment["executor_gpu"] == "NVIDIA H200"
            assert measured.environment["executor_cuda"] and measured.environment["torch"].startswith("2.")


def test_a_gpu_committed_run_audited_on_this_cpu_passes_when_honest_and_every_cheat_is_rejected(tmp_path, monkeypatch):
    """The held-out red team's cheats (verify/variants.py: the mildest lr×0.9, skipped steps, other data, reordered
    batches, bf16 autocast, a frozen optimizer) on a run that commits ``device: cuda``, audited as a CPU broker
    audits a miner's GPU run: at the recipe's shipped config, with its shipped cuda→cpu calibration (measured on an
    H200)."""
    from audit_support import commit, train, with_segment
    from trainmaster.jobs.spec import load_spec
    from trainmaster.verify.audit import run_audit
    from trainmaster.verify.openings import LocalOpenings
    from trainmaster.verify.recipe_run import recipe_run
    from trainmaster.verify.variants import CHEATS, FREEZES, execute

    monkeypatch.delenv(AUDIT_DEVICE_ENV, raising=False)
    shipped = recipe_run(load_spec(ROOT / "configs" / "examples" / "tiny-lm" / "job.yaml"))
    config, k, drawn = {**shipped.config, "steps": 4 * shipped.k}, shipped.k, 2
    choice = choose("cuda", shipped.job_class, calibration_dir=tmp_path / "none")
    assert (choice.device, choice.pair, choice.calibration.pair) == ("cpu", "cuda→cpu", "cuda→cpu")
    honest = train(shipped.recipe, config, shipped.seed, k)

    def audited(run, where: Path):
        commitment = commit(run, where).model_copy(update={"device": "cuda"})
        report = run_audit(commitment=commitment, openings=LocalOpenings(where), segments=[drawn], recipe=shipped.recipe,
                           config=config, seed=shipped.seed, calibration=choice.calibration, device=choice.device,
                           calibration_note=choice.note)
        assert (report.executor_device, report.device) == ("cuda", "cpu")
        return report.segments[0]

    assert audited(honest, tmp_path / "honest").passed
    for cheat in (*CHEATS, FREEZES[0]):
        run = with_segment(honest, drawn, execute(honest.recipe, honest.states[drawn], k, cheat))
        segment = audited(run, tmp_path / cheat.name)
        assert not segment.passed and segment.reasons, cheat.name
