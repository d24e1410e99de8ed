"""The whole state is audited, and hyperparameters come from the spec (tiny-lm, AdamW with weight decay).

Each attack froze training or delivered chosen weights while every weight-level check passed:
inflated Adam second moments, or hyperparameters (eps, weight decay, maximize, betas, lr) written
into the states' optimizer param groups. Each is now refused with a reason that names the entry.
"""

from __future__ import annotations

import pytest
import torch

from trainmaster.jobs.recipes import get_recipe
from trainmaster.jobs.state import TrainState, json_tensor, tensor_json
from trainmaster.verify.audit import run_audit
from trainmaster.verify.openings import LocalOpenings
from trainmaster.verify.plausibility import implausible_moments, moment_bound
from trainmaster.verify.variants import FREEZES, Execution, Variant, execute

from audit_support import TINY_LM, Run, commit, frozen, train, variant_segments, walking_to

K = 10
SEED = 11
LM = get_recipe("tiny-lm")
CONFIG = {**TINY_LM, "weight_decay": 0.01}
TAU = 6e-3
"""About τ(10) of this class (docs/audit.md); every refusal here is exact, so its value does not matter."""
GROUPS = "optimizer/param_groups.json"


@pytest.fixture(scope="module")
def honest() -> Run:
    return train(LM, CONFIG, SEED, K)


def audit(run: Run, root, segments):
    return run_audit(
        commitment=commit(run, root), openings=LocalOpenings(root), segments=segments,
        recipe="tiny-lm", config=CONFIG, seed=SEED, tau=TAU,
    )


def rejected(report) -> list[int]:
    return [e.index for e in report.segments if not e.passed]


def test_the_honest_run_passes_with_every_entry_compared(honest, tmp_path):
    report = audit(honest, tmp_path, [0, 3, 5])
    assert report.passed, report.reasons
    for segment in report.segments:
        assert segment.exact_mismatches == [] and segment.exact_compared == len(honest.states[segment.index + 1].rest)
        assert {"optimizer/state/*/exp_avg", "optimizer/state/*/exp_avg_sq", "recent_losses"} == set(segment.fields)


@pytest.mark.parametrize("freeze", FREEZES, ids=[v.name for v in FREEZES])
def test_a_freeze_through_a_hyperparameter_is_refused_naming_it(freeze: Variant, tmp_path):
    """Every segment trained with the tampered hyperparameter, which the states record: S_1 is not what
    segment 0 produces, and any later S_i does not survive loading into the spec's optimizer."""
    run = train(LM, CONFIG, SEED, K, variant_segments(LM, K, freeze))
    key = next(iter(freeze.param_groups), "lr")
    report = audit(run, tmp_path, [0, 3, 5])
    assert rejected(report) == [0, 3, 5], report.reasons
    assert all(f"{GROUPS}: [0].{key}" in " ".join(e.reasons) for e in report.segments), report.reasons
    if key != "lr":  # the spec's lr is set by the schedule every step; any other stored value is refused on load
        assert all("not what the spec's trainer loads" in e.reasons[0] for e in report.segments[1:])


def test_weight_decay_0_committed_in_s1_is_refused(honest, tmp_path):
    states = list(honest.states)
    groups = [{**group, "weight_decay": 0.0} for group in tensor_json(states[1].rest[GROUPS])]
    states[1] = TrainState(weights=states[1].weights, rest={**states[1].rest, GROUPS: json_tensor(groups)})
    report = audit(Run(LM, SEED, K, states, honest.traces), tmp_path, [0, 1])
    assert rejected(report) == [0, 1]
    assert f"{GROUPS}: [0].weight_decay is 0.0, not 0.01" in report.segments[0].reasons[0]  # S_1 as committed
    assert f"{GROUPS}: [0].weight_decay is 0.0, not 0.01" in report.segments[1].reasons[0]  # S_1 as loaded


def _frozen_after_segment_0(honest: Run) -> Run:
    """S_1 with Adam's second moments × 1e12; every later segment honestly trained from there (and barely moving)."""
    run = Run(LM, SEED, K, [honest.states[0], frozen(honest.states[1])], [honest.traces[0]])
    for _ in range(1, honest.n):
        executed: Execution = execute(LM, run.states[-1], K)
        run.states.append(executed.state)
        run.traces.append(executed.trace)
    return run


def test_a_freeze_through_the_moments_is_refused_at_segment_0(honest, tmp_path):
    run = _frozen_after_segment_0(honest)
    moved = sum(float((run.states[-1].weights[n] - run.states[1].weights[n]).norm()) for n in run.states[1].weights)
    honest_moved = sum(float((honest.states[-1].weights[n] - honest.states[1].weights[n]).norm()) for n in run.states[1].weights)
    assert moved < 0.05 * honest_moved  # training did stop
    report = audit(run, tmp_path, [0, run.n - 1])
    assert 0 in rejected(report)
    assert "S_1's optimizer/state/*/exp_avg_sq is not what these k steps produce" in report.segments[0].reasons[0]


def test_delivering_chosen_weights_is_refused(honest, tmp_path):
    """Frozen after segment 0, then an S_{n−1} whose Adam moments walk the weights to another seed's model."""
    run = _frozen_after_segment_0(honest)
    target = train(LM, CONFIG, SEED + 1, K).states[-1].weights
    last = run.n - 1
    run.states[last] = walking_to(LM, run.states[last], K, target)
    delivered = execute(LM, run.states[last], K)
    run.states[-1], run.traces[-1] = delivered.state, delivered.trace
    gap = sum(float((delivered.state.weights[n] - target[n]).square().sum()) for n in target) ** 0.5
    start_gap = sum(float((run.states[last].weights[n] - target[n]).square().sum()) for n in target) ** 0.5
    assert gap < 0.05 * start_gap  # the attack delivers W*
    report = audit(run, tmp_path, [0, last])
    assert rejected(report) == [0, last]
    assert "S_1's optimizer/state/*/exp_avg_sq" in report.segments[0].reasons[0]
    assert f"S_{last} cannot come from honest training: optimizer/state/" in report.segments[1].reasons[0]
    assert "|m| / √v reaches" in report.segments[1].reasons[0]


def test_honest_adam_moments_stay_within_their_bound(honest):
    assert moment_bound(0.9, 0.999) == pytest.approx(7.27, abs=0.01)
    assert moment_bound(0.9, 0.8) == float("inf")  # β₁² ≥ β₂: no bound, nothing checked
    for state in honest.states:
        assert implausible_moments(state.rest, honest.states[0].rest) == []
    for name, m in honest.states[-1].rest.items():
        if name.endswith("/exp_avg"):
            v = honest.states[-1].rest[name + "_sq"]
            assert float((m.abs() / v.sqrt()).nan_to_num(0).max()) < moment_bound(0.9, 0.999)


def test_an_unruled_entry_is_refused(honest, tmp_path):
    """An entry no rule of the recipe covers is never taken on trust, even when the re-execution holds it too."""
    bare = type(LM)(LM.name, LM.config_type, LM.build, type(LM.rules)(fields={}))
    report = run_audit(
        commitment=commit(honest, tmp_path), openings=LocalOpenings(tmp_path), segments=[2],
        recipe=bare, config=CONFIG, seed=SEED, tau=TAU,
    )
    assert not report.passed
    assert "optimizer/param_groups.json: no rule of the recipe covers this entry" in report.reasons[0]


def test_nan_moments_in_s_i_are_refused(honest, tmp_path):
    states = list(honest.states)
    name = next(n for n in states[2].rest if n.endswith("/exp_avg_sq"))
    states[2] = TrainState(weights=states[2].weights, rest={**states[2].rest, name: torch.full_like(states[2].rest[name], float("inf"))})
    report = audit(Run(LM, SEED, K, states, honest.traces), tmp_path, [2])
    assert rejected(report) == [2] and f"S_2 holds NaN or Inf in {name}" in report.reasons[0]
