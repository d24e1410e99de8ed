"""The replay audit on tiny-lm: honest-but-different executors pass, every cheat class is rejected when drawn."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trainmaster.jobs.checkpoint import WEIGHTS, read_canonical_file, segment_dir
from trainmaster.jobs.canonical import serialize
from trainmaster.jobs.recipes import get_recipe
from trainmaster.jobs.state import TrainState
from trainmaster.verify.audit import run_audit
from trainmaster.verify.calibrate import calibrate
from trainmaster.verify.calibration import UncalibratedError
from trainmaster.verify.challenge import draw_segments
from trainmaster.verify.openings import LocalOpenings
from trainmaster.verify.variants import CHEATS, HONEST_VARIANTS, VERIFIER, Execution, execute

from audit_support import TINY_LM, Run, commit, interpolate, train, update_size, variant_segments, with_weights

K = 10
SEED = 7
LM = get_recipe("tiny-lm")


@pytest.fixture(scope="module")
def calibration():
    return calibrate("tiny-lm", TINY_LM, ks=[K], seeds=[0, 1, 2], warmup=20)


@pytest.fixture(scope="module")
def honest_run() -> Run:
    return train(LM, TINY_LM, SEED, K)


def audit(run: Run, root, segments, calibration, **kw):
    commitment = commit(run, root, job_id=kw.pop("job_id", "job-a"))
    return run_audit(
        commitment=commitment, openings=LocalOpenings(root), segments=segments,
        recipe="tiny-lm", config=TINY_LM, seed=SEED, calibration=calibration, **kw,
    )


def rejected(report) -> list[int]:
    return [e.index for e in report.segments if not e.passed]


def test_the_calibration_separates_honest_from_the_mildest_cheat(calibration):
    point = calibration.point(K)
    assert point.separation >= 10 and point.honest_p99 < point.tau < point.cheat_min
    assert calibration.warnings() == []


@pytest.mark.slow
def test_honest_but_different_executors_are_never_rejected(calibration, tmp_path):
    """30 seeds, each trained by another honest variant on every segment: zero false rejects."""
    config = {**TINY_LM, "steps": 3 * K}
    rs = []
    for j in range(30):
        variant = HONEST_VARIANTS[j % len(HONEST_VARIANTS)]
        seed = 100 + j
        run = train(LM, config, seed, K, variant_segments(LM, K, variant))
        report = run_audit(
            commitment=commit(run, tmp_path / str(j)), openings=LocalOpenings(tmp_path / str(j)),
            segments=[0, 1, 2], recipe="tiny-lm", config=config, seed=seed, calibration=calibration,
        )
        assert report.passed, (variant.name, seed, report.reasons)
        rs += [e.r for e in report.segments]
    assert 0 < float(np.percentile(rs, 99)) < calibration.tau(K) / 3


def test_a_same_environment_executor_passes_even_the_exact_audit(honest_run, tmp_path, calibration):
    report = audit(honest_run, tmp_path, [0, 2, 5], calibration, trusted_exact=True)
    assert report.passed and report.tau_source == "exact"
    assert all(e.r == 0 and e.divergence == 0 for e in report.segments)


def test_an_honest_but_different_executor_fails_the_exact_audit_only(tmp_path, calibration):
    run = train(LM, TINY_LM, SEED, K, variant_segments(LM, K, HONEST_VARIANTS[1]))
    commit(run, tmp_path)
    assert audit(run, tmp_path / "a", [0, 5], calibration).passed
    exact = audit(run, tmp_path / "b", [0, 5], calibration, trusted_exact=True)
    assert rejected(exact) == [0, 5] and "exactly" in exact.reasons[0]


@pytest.mark.parametrize("cheat", CHEATS, ids=[c.name for c in CHEATS])
def test_each_cheat_is_rejected_when_its_segment_is_drawn(cheat, tmp_path, calibration):
    run = train(LM, TINY_LM, SEED, K, variant_segments(LM, K, cheat, faked={3}))
    report = audit(run, tmp_path, [0, 3, 5], calibration)
    assert rejected(report) == [3], report.reasons
    assert report.segments[1].r > calibration.tau(K)
    assert "exceeds τ" in report.reasons[0]


def test_linearly_interpolated_fake_states_are_rejected(honest_run, tmp_path, calibration):
    """Segments 2..5 are a straight line from W_2 to the honest final weights: no training done."""
    fake = Run(LM, SEED, K, honest_run.states[:3], honest_run.traces[:2])
    start, end = honest_run.states[2].weights, honest_run.states[-1].weights
    for i in range(3, 7):
        fake.states.append(with_weights(honest_run.states[2], interpolate(start, end, (i - 2) / 4), i * K))
        fake.traces.append(honest_run.traces[i - 1])
    report = audit(fake, tmp_path, [0, 1, 3, 5], calibration)
    assert rejected(report) == [3, 5]
    assert all(report.segments[j].r > 0.3 for j in (2, 3)), [e.r for e in report.segments]


def test_a_state_that_does_not_match_its_leaf_is_rejected(honest_run, tmp_path, calibration):
    commitment = commit(honest_run, tmp_path)
    path = segment_dir(tmp_path, 3) / WEIGHTS
    weights = read_canonical_file(path)
    weights["head.bias"] += 1e-4
    path.write_bytes(serialize(weights))
    report = run_audit(
        commitment=commitment, openings=LocalOpenings(tmp_path), segments=[0, 3, 5],
        recipe="tiny-lm", config=TINY_LM, seed=SEED, calibration=calibration,
    )
    assert rejected(report) == [3] and "does not match leaf 3" in report.reasons[0]


def test_a_result_replayed_from_another_job_is_rejected(tmp_path, calibration):
    other = train(LM, TINY_LM, SEED + 1, K)
    report = audit(other, tmp_path / "as-is", [0, 3, 5], calibration)
    assert rejected(report) == [0, 3, 5] and "another job" in report.reasons[0]
    # Relabelled with this job's seed, its states still fail: W0 is not ours, and the data of our seed
    # does not lead from one of its states to the next.
    for state in other.states:
        state.rest["runtime/seed"] = torch.tensor(SEED, dtype=torch.int64)
    report = audit(other, tmp_path / "relabelled", [0, 3, 5], calibration)
    assert rejected(report) == [0, 3, 5]
    assert "W0" in report.reasons[0] and all(e.r > 0.5 for e in report.segments[1:])


def test_magnitude_gaming_is_caught_by_the_uniform_draw(tmp_path, calibration):
    """Blindfold top-Q: genuine segments are exactly the largest updates, the others sub-δ fakes."""
    config, n, q = {**TINY_LM, "steps": 8 * K}, 8, 2
    genuine = train(LM, config, SEED, K)
    fake = Run(LM, SEED, K, genuine.states[:5], genuine.traces[:4])
    target = train(LM, config, SEED + 1, K).states[-1].weights  # the model the cheater wants to deliver
    for i in range(5, 8):  # segments 4, 5, 6: a tiny step towards the target, no training
        previous = fake.states[-1]
        fake.states.append(with_weights(genuine.states[4], interpolate(previous.weights, target, 1e-4), i * K))
        fake.traces.append(genuine.traces[i - 1])
    last = execute(LM, fake.states[-1], K)  # segment 7 genuinely trained, from the fake S_7
    fake.states.append(last.state)
    fake.traces.append(last.trace)
    faked = {4, 5, 6}
    by_magnitude = sorted(range(n), key=lambda i: update_size(fake, i), reverse=True)[: q + 2]
    assert not faked & set(by_magnitude), "a magnitude-based picker would have audited only genuine segments"
    commitment = commit(fake, tmp_path, job_id="job-a")
    secret = next(s for s in (bytes([b]) * 32 for b in range(256)) if faked & set(draw_segments(s, commitment.root, n, q)))
    drawn = draw_segments(secret, commitment.root, n, q)
    report = run_audit(
        commitment=commitment, openings=LocalOpenings(tmp_path), segments=drawn,
        recipe="tiny-lm", config=config, seed=SEED, calibration=calibration,
    )
    assert not report.passed and rejected(report) == sorted(faked & set(drawn))
    assert all(e.passed for e in report.segments if e.index not in faked)


def test_a_manipulated_optimizer_state_fails_the_update_norm_check(honest_run, tmp_path, calibration):
    """S_3 with Adam's second moments inflated 1e12×: the re-execution barely moves, and so does the executor.

    Segment 2, which committed that S_3, is caught by the comparison of S_3's moments; segments 3
    and 5, which honestly train on from it, by the update-norm floor."""
    states = list(honest_run.states[:4])
    rest = {name: t * 1e12 if name.endswith("/exp_avg_sq") else t for name, t in states[3].rest.items()}
    states[3] = with_weights(states[3], states[3].weights, 3 * K)
    states[3].rest.update(rest)
    run = Run(LM, SEED, K, states, honest_run.traces[:3])
    for _ in range(3, 6):
        executed: Execution = execute(LM, run.states[-1], K, VERIFIER)
        run.states.append(executed.state)
        run.traces.append(executed.trace)
    report = audit(run, tmp_path, [0, 2, 3, 5], calibration)
    assert rejected(report) == [2, 3, 5]
    assert report.segments[1].reasons == [
        f"S_3's optimizer/state/*/exp_avg_sq is not what these k steps produce: r = "
        f"{report.segments[1].fields['optimizer/state/*/exp_avg_sq'].r:.3g} exceeds its tolerance "
        f"{report.segments[1].fields['optimizer/state/*/exp_avg_sq'].tolerance:.3g} (most in "
        f"{report.segments[1].fields['optimizer/state/*/exp_avg_sq'].worst})"
    ]
    segment = report.segments[2]
    assert segment.r < calibration.tau(K) and segment.update_per_lr < segment.update_floor
    assert "implausibly small" in segment.reasons[0]


def test_an_update_above_the_calibrated_ceiling_is_rejected(honest_run, tmp_path, calibration):
    """The ceiling is checked on every replayed segment: here a calibration whose ceiling sits below this
    honest run's updates stands in for moments crafted to move the weights further than any honest run."""
    point = calibration.point(K)
    assert point.update_ceiling == pytest.approx(10 * point.max_update_per_lr)
    report = audit(honest_run, tmp_path, [2], calibration)
    assert report.passed and report.segments[0].update_per_lr < report.segments[0].update_ceiling
    low = point.model_copy(update={"update_ceiling": report.segments[0].update_per_lr / 2})
    report = audit(honest_run, tmp_path, [2], calibration.model_copy(update={"points": [low]}))
    assert rejected(report) == [2] and "implausibly large" in report.reasons[0] and "calibrated ceiling" in report.reasons[0]


@pytest.mark.parametrize(("factor", "passes"), [(1.05, True), (1.5, False)])
def test_a_reported_loss_is_held_to_a_fixed_bound(honest_run, tmp_path, calibration, factor, passes):
    """``recent_losses`` is reported, never read back: within 10 % of the re-execution's it passes, beyond it not."""
    states = list(honest_run.states)
    rest = {**states[3].rest, "recent_losses": states[3].rest["recent_losses"] * factor}
    states[3] = TrainState(weights=states[3].weights, rest=rest)
    report = audit(Run(LM, SEED, K, states, honest_run.traces), tmp_path, [2], calibration)
    field = report.segments[0].fields["recent_losses"]
    assert (field.rule, field.tolerance, report.passed) == ("reported", 0.1, passes), report.reasons
    assert field.r == pytest.approx(factor - 1, rel=1e-6)


def test_malformed_states_are_rejected_not_crashed_on(honest_run, tmp_path, calibration):
    """Committed, so past the openings check, but not states this recipe can load."""
    run = Run(LM, SEED, K, list(honest_run.states), list(honest_run.traces))
    reshaped = {**run.states[2].weights, "head.bias": torch.zeros(7)}
    run.states[2] = with_weights(run.states[2], reshaped, 2 * K)
    no_optimizer = {n: t for n, t in run.states[4].rest.items() if not n.startswith("optimizer/")}
    run.states[4] = TrainState(weights=run.states[4].weights, rest=no_optimizer)
    report = audit(run, tmp_path, [2, 4, 5], calibration)
    assert rejected(report) == [2, 4]
    assert "not the 19952 bytes of the spec model's tensors" in report.reasons[0] and "cannot be loaded" in report.reasons[1]


def test_the_report_carries_the_evidence(honest_run, tmp_path, calibration):
    report = audit(honest_run, tmp_path, [5, 0, 2, 2], calibration)
    assert report.passed and [e.index for e in report.segments] == [0, 2, 5]
    assert report.tau == calibration.tau(K) and report.tau_source == "calibration" and report.k == K
    for e in report.segments:
        assert e.r is not None and 0 <= e.r <= e.tau and e.update_norm > 0 and e.update_per_lr > e.update_floor
        assert e.hashes.replay_weights_sha256 == e.hashes.next_weights_sha256
        assert e.decisions.compared == 0 and e.exact_compared > 0 and e.exact_mismatches == []
        assert set(e.fields) == {"optimizer/state/*/exp_avg", "optimizer/state/*/exp_avg_sq", "recent_losses"}
        assert all(f.r <= f.tolerance for f in e.fields.values())
    assert '"index":0' in report.model_dump_json()


def test_an_uncalibrated_class_needs_an_explicit_tau(honest_run, tmp_path, calibration):
    commitment = commit(honest_run, tmp_path)
    kwargs = dict(commitment=commitment, openings=LocalOpenings(tmp_path), segments=[0], recipe="tiny-lm", seed=SEED)
    with pytest.raises(UncalibratedError, match="uncalibrated"):
        run_audit(config=TINY_LM, **kwargs)
    with pytest.raises(UncalibratedError, match="is for job class"):
        run_audit(config={**TINY_LM, "lr": 1e-6}, calibration=calibration, **kwargs)
    uncalibrated_k = calibration.model_copy(update={"points": []})
    with pytest.raises(UncalibratedError, match="not calibrated for k = 10"):
        run_audit(config=TINY_LM, calibration=uncalibrated_k, **kwargs)
    report = run_audit(config=TINY_LM, tau=0.01, **kwargs)
    assert report.passed and report.tau_source == "explicit" and report.update_floor is None
    with pytest.raises(ValueError, match="outside"):
        run_audit(config=TINY_LM, tau=0.01, **{**kwargs, "segments": [6]})
    assert math.isfinite(report.segments[0].r)
