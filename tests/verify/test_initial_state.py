"""S_0 across CPU kernel sets (verify/initial_state.py): torch's portable kernels (ATEN_CPU_CAPABILITY=default) draw
another W0 from the same recipe and seed than this machine's vector kernels, so an honest executor on them commits
another S_0. The verifier rebuilds S_0 with the kernel set the commitment names, in a child process, and compares it
bit for bit: the honest executor passes; a W0 of its own choosing fails whatever it names; a kernel set this CPU
cannot select leaves S_0 unjudged (never accepted silently); the segment replays across the two kernel sets stay
within the calibrated τ(k) of this machine's cpu→cpu calibration.

The runs "of another CPU" are trained and committed in child processes started with ATEN_CPU_CAPABILITY=default.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainmaster.jobs.canonical import state_sha256
from trainmaster.jobs.commitment import Commitment
from trainmaster.jobs.devices import cpu_capability, fingerprint, fingerprint_cpu_kernels
from trainmaster.jobs.execution import build_trainer, full_state
from trainmaster.jobs.recipes import get_recipe
from trainmaster.verify.audit import run_audit
from trainmaster.verify.calibrate import calibrate
from trainmaster.verify.errors import VerificationError
from trainmaster.verify.initial_state import RebuildError, rebuild
from trainmaster.verify.openings import LocalOpenings

from audit_support import TINY_LM

TESTS = Path(__file__).resolve().parent.parent
SEED, K = 7, 10
NOT_HERE = "ZVECTOR"
"""A kernel set torch knows (s390x's) that no machine running these tests can select."""
TRAIN = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from audit_support import BUNDLE, TINY_LM, commit, train
from trainmaster.jobs.commitment import build_commitment

kind, root = sys.argv[1], Path(sys.argv[2])
run = train("tiny-lm", TINY_LM, {seed}, {k})
if kind == "w0":  # a W0 of its own choosing (another seed's model), trained on honestly
    from audit_support import variant_segments
    from trainmaster.verify.variants import VERIFIER
    chosen = train("tiny-lm", {{**TINY_LM, "steps": {k}}}, {seed} + 1, {k}).states[0].weights
    run.states = [type(run.states[0])(dict(chosen), dict(run.states[0].rest))]
    run.traces = []
    segment = variant_segments(run.recipe, {k}, VERIFIER)
    for i in range(TINY_LM["steps"] // {k}):
        executed = segment(i, run.states[-1])
        run.states.append(executed.state)
        run.traces.append(executed.trace)
commit(run, root)
made = build_commitment(root, job_id="job-a", bundle_sha256=BUNDLE, n=run.n, k=run.k, record_environment=True)
(root / "commitment.json").write_bytes(made.canonical_json())
"""


def _portable_run(root: Path, kind: str = "honest") -> Commitment:
    """A run trained and committed by a process computing with torch's portable kernels."""
    root.mkdir(parents=True, exist_ok=True)
    code = TRAIN.format(tests=str(TESTS), seed=SEED, k=K)
    done = subprocess.run([sys.executable, "-c", code, kind, str(root)], env={**os.environ, "ATEN_CPU_CAPABILITY": "default"},
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return Commitment.from_json((root / "commitment.json").read_bytes())


@pytest.fixture(scope="module")
def calibration():
    """This machine's own cpu→cpu calibration of the job class (its honest variants never change kernel sets)."""
    return calibrate("tiny-lm", TINY_LM, ks=[K], seeds=[0, 1, 2], warmup=20)


@pytest.fixture(scope="module")
def portable(tmp_path_factory) -> tuple[Path, Commitment]:
    root = tmp_path_factory.mktemp("portable")
    return root, _portable_run(root)


def _audit(root: Path, commitment: Commitment, calibration, **kw):
    return run_audit(commitment=commitment, openings=LocalOpenings(root), segments=list(range(commitment.n)),
                     recipe="tiny-lm", config=TINY_LM, seed=SEED, calibration=calibration, boundary_chunks=2, **kw)


def _native_s0() -> tuple[str, str]:
    recipe = get_recipe("tiny-lm")
    cfg = recipe.config(TINY_LM)
    state = full_state(build_trainer(recipe, cfg, SEED), recipe, cfg, SEED, 0)
    return state_sha256(state.weights), state_sha256(state.rest)


def test_this_machine_selects_vector_kernels():
    """Every test below needs a verifier whose kernels are not the portable ones."""
    assert cpu_capability() not in ("DEFAULT", "unknown") and cpu_capability() == torch.backends.cpu.get_cpu_capability()


@pytest.mark.parametrize(("text", "kernels"), [
    ("torch 2.13.0+cpu; cpu DEFAULT", "DEFAULT"),
    ("torch 2.13.0+cpu; cpu AVX512", "AVX512"),
    ("torch 2.13.0+cu128; cuda 12.8; cudnn 91002; NVIDIA H200; cublas :4096:8", None),  # before it named one
    ("torch 2.13.0+cu128; cuda 12.8; cudnn 91002; NVIDIA H200; cublas :4096:8; cpu AVX512", "AVX512"),
    (None, None),
    ("torch 2.13.0+cpu; cpu unknown", None),  # an older torch that does not tell
    ("torch 2.13.0+cpu; cpu default", None),  # not a name torch reports
    ("torch 2.13.0+cpu; cpu AVX2 $(reboot)", None),
    ("torch 2.13.0+cpu; gpu cpu AVX2", None),
])
def test_the_kernel_set_is_read_from_the_commitments_fingerprint(text, kernels):
    assert fingerprint_cpu_kernels(text) == kernels


def test_this_processs_fingerprint_names_its_kernel_set():
    assert fingerprint_cpu_kernels(fingerprint("cpu")) == cpu_capability()


def test_a_gpu_runs_fingerprint_names_the_cpu_kernels_that_drew_its_w0(monkeypatch):
    """A GPU job initialises its W0 on the CPU: an AVX-512 GPU miner's W0 is not an AVX2 verifier's, so its
    commitment names that kernel set too, and the S_0 rule reads it (rebuilt, or not judged: never a reject)."""
    from trainmaster.jobs import devices
    from trainmaster.verify.initial_state import claimed_kernels

    monkeypatch.setattr(devices, "cuda_available", lambda: True)
    monkeypatch.setattr(devices, "describe_device", lambda kind: {"cuda": "12.8", "cudnn": 91002, "gpu": "NVIDIA H200"})
    text = devices.fingerprint("cuda")
    assert text.startswith("torch ") and "; cuda 12.8; cudnn 91002; NVIDIA H200; cublas " in text, text
    assert text.endswith(f"; cpu {cpu_capability()}") and fingerprint_cpu_kernels(text) == cpu_capability()

    class GpuCommitment:
        device_kind = "cuda"
        deterministic = text.replace(f"cpu {cpu_capability()}", "cpu AVX512")

    assert claimed_kernels(GpuCommitment()) == "AVX512"


def test_the_portable_kernels_draw_another_w0_which_the_child_rebuilds_bit_for_bit(portable):
    root, commitment = portable
    assert fingerprint_cpu_kernels(commitment.deterministic) == "DEFAULT"
    from trainmaster.jobs.checkpoint import read_segment, segment_dir

    committed = read_segment(segment_dir(root, 0)).state
    rebuilt = rebuild("tiny-lm", get_recipe("tiny-lm").config(TINY_LM).model_dump(mode="json"), SEED, "DEFAULT")
    assert rebuilt["kernels"] == "DEFAULT"
    assert (rebuilt["weights_sha256"], rebuilt["rest_sha256"]) == (state_sha256(committed.weights),
                                                                    state_sha256(committed.rest))
    native_weights, native_rest = _native_s0()
    assert rebuilt["weights_sha256"] != native_weights  # the defect: another W0 from the same recipe and seed
    assert rebuilt["rest_sha256"] == native_rest


def test_an_honest_run_on_the_portable_kernels_passes_the_sampled_audit(portable, calibration):
    root, commitment = portable
    report = _audit(root, commitment, calibration)
    assert report.passed, report.reasons
    initial = report.initial_state
    assert (initial.kernels, initial.verifier_kernels, initial.rebuilt, initial.matched) == (
        "DEFAULT", cpu_capability(), "child", True)
    tau = calibration.point(K).tau
    worst = max(e.r for e in report.segments)
    print(f"\nr across kernel sets (DEFAULT executor, {cpu_capability()} verifier), k = {K}: "
          f"{[f'{e.r:.3g}' for e in report.segments]}; honest p99 {calibration.point(K).honest_p99:.3g}, τ {tau:.3g}")
    assert 0 < worst <= tau / 3  # inside the calibrated honest band: well below τ (√R ≥ 3.2 margin)


def test_the_same_s0_under_the_verifiers_own_kernel_name_is_rejected(portable, calibration):
    """A claim the verifier can reproduce is checked exactly: the portable W0 is not this kernel set's W0."""
    root, commitment = portable
    lying = commitment.model_copy(update={"deterministic": fingerprint("cpu")})
    report = _audit(root, lying, calibration)
    assert not report.passed and report.cannot_judge is None
    assert report.initial_state.rebuilt == "here" and report.initial_state.matched is False
    assert any(r.startswith("segment 0: S_0's weights are not the W0 the spec's recipe and seed produce with the CPU "
                            f"kernel set {cpu_capability()}") for r in report.reasons), report.reasons


def test_a_chosen_w0_is_rejected_whichever_kernel_set_it_names(tmp_path, calibration):
    root = tmp_path / "w0"
    commitment = _portable_run(root, "w0")
    report = _audit(root, commitment, calibration)
    assert not report.passed and report.cannot_judge is None
    assert report.initial_state.matched is False
    assert "segment 0: S_0's weights are not the W0 the spec's recipe and seed produce with the CPU kernel set " \
           "DEFAULT" in report.reasons, report.reasons
    elsewhere = _audit(root, commitment.model_copy(update={"deterministic": fingerprint("cpu")}), calibration)
    assert not elsewhere.passed and elsewhere.initial_state.matched is False


def test_a_kernel_set_this_cpu_cannot_select_leaves_s0_unjudged_never_accepted(portable, calibration):
    root, commitment = portable
    with pytest.raises(RebuildError, match=f"CPU kernel set {NOT_HERE}.*cannot select it"):
        rebuild("tiny-lm", get_recipe("tiny-lm").config(TINY_LM).model_dump(mode="json"), SEED, NOT_HERE)
    claimed = commitment.model_copy(update={"deterministic": f"torch {torch.__version__}; cpu {NOT_HERE}"})
    report = _audit(root, claimed, calibration)
    assert not report.passed and report.initial_state.matched is None
    assert report.cannot_judge and "cannot select it" in report.cannot_judge
    assert report.reasons == ["segment 0: " + report.cannot_judge]  # every other check passed


def test_an_unjudged_s0_does_not_shield_a_failing_segment(portable, calibration, tmp_path):
    """Naming a kernel set nobody here can select buys a cheat nothing: its other segments are judged as ever."""
    import shutil

    from trainmaster.jobs.checkpoint import read_segment, segment_dir, write_segment
    from trainmaster.jobs.commitment import build_commitment
    from trainmaster.jobs.execution import state_info

    from audit_support import BUNDLE, frozen

    root, commitment = portable
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    loaded = read_segment(segment_dir(copy, 3))
    state = loaded.state
    write_segment(copy, 3, frozen(state), loaded.trace, job_id="job-a", recipe="tiny-lm", step=3 * K, k=K)
    made = build_commitment(copy, job_id="job-a", bundle_sha256=BUNDLE, n=commitment.n, k=K)
    claimed = made.model_copy(update={"deterministic": f"torch {torch.__version__}; cpu {NOT_HERE}"})
    report = _audit(copy, claimed, calibration)
    assert not report.passed and report.cannot_judge is None and report.initial_state.matched is None
    assert any(r.startswith("segment 2:") or r.startswith("segment 3:") for r in report.reasons), report.reasons
    assert state_info(state).step == 3 * K


def test_the_pipeline_says_cannot_verify_for_an_unjudged_s0():
    """The verification's kind when every check passed but S_0 could not be judged on this machine."""
    from trainmaster.verify.evidence import AuditReport
    from trainmaster.verify import pipeline

    report = AuditReport(passed=False, cannot_judge="S_0 was built with the CPU kernel set AVX512, and this verifier's "
                         "CPU cannot select it", reasons=["segment 0: …"], recipe="tiny-lm", k=K, tau=0.1,
                         tau_source="explicit", margin_tol=0.0, update_floor=None, segments=[], replay_seconds=0.0)
    with pytest.raises(VerificationError) as caught:
        pipeline._raise_for(report)
    assert caught.value.kind == "cannot_verify" and "cannot be completed here" in caught.value.reason


def test_a_jobs_own_recipe_is_rebuilt_from_its_import_path(tmp_path, monkeypatch):
    """A spec's `recipe: module:attr` (audited in recipe_audit's child, whose import path holds the bundle): the
    rebuild imports it the same way."""
    (tmp_path / "own_recipe.py").write_text("from trainmaster.jobs.recipes.tiny_lm import RECIPE\nNOT_ONE = 3\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    config = get_recipe("tiny-lm").config(TINY_LM).model_dump(mode="json")
    assert rebuild("own_recipe:RECIPE", config, SEED, "DEFAULT") == rebuild("tiny-lm", config, SEED, "DEFAULT")
    with pytest.raises(RebuildError, match="failed to rebuild it.*not a Recipe"):
        rebuild("own_recipe:NOT_ONE", config, SEED, "DEFAULT")
