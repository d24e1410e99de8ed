"""The learner audit on clipped PPO (CartPole): a recipe whose weights change only at rollout ends.

Segments of k = 64 steps hold exactly one policy update each (rollout = 64, aligned); k = 128 holds
two. One honest run is trained once; each test replaces one segment j by what an honest-but-
different or a cheating executor commits, and audits it.
"""

from __future__ import annotations

import pytest
import torch

from trainmaster.jobs.recipes import get_recipe
from trainmaster.jobs.state import TrainState, json_tensor
from trainmaster.verify.calibrate import calibrate_states, warm_state
from trainmaster.verify.variants import HONEST_VARIANTS, Execution, execute

from audit_support import Run, audit_one, rl_cheats, train, with_segment

pytestmark = pytest.mark.slow

PPO = get_recipe("ppo")
CONFIG = {"steps": 768, "rollout": 64, "epochs": 2, "minibatch": 32, "lr": 1e-3, "hidden": 32}
SEED = 3
KS = (64, 128)
START = 384
"""The audited segment starts here, six updates into training."""


@pytest.fixture(scope="module")
def honest() -> dict[int, Run]:
    return {k: train(PPO, CONFIG, SEED, k) for k in KS}


@pytest.fixture(scope="module")
def calibration(honest):
    run = honest[KS[0]]
    return calibrate_states(PPO, [run.states[192 // run.k], run.states[512 // run.k]], ks=KS)


def test_calibration_separates_honest_executors_from_the_mildest_cheat(calibration):
    for k in KS:
        point = calibration.point(k)
        assert point.separation >= 10, (k, point)


@pytest.mark.parametrize("k", KS)
def test_honest_but_different_executors_pass(k, honest, calibration, tmp_path):
    run, j = honest[k], START // k
    for variant in HONEST_VARIANTS:
        executed = execute(PPO, run.states[j], k, variant)
        report, segment = audit_one(with_segment(run, j, executed), j, tmp_path / variant.name, calibration)
        assert report.passed, (variant.name, report.reasons)
        assert segment.exact_compared > 0 and segment.exact_mismatches == []
        assert segment.decisions.compared == k  # one sampled action per step


def _fewer_epochs(state: TrainState, k: int) -> Execution:
    """Runs the rollout's update for one epoch instead of the spec's two (half the update compute)."""
    cheap = execute(PPO, _with_config(state, {**CONFIG, "epochs": 1}), k)
    return Execution(_with_config(cheap.state, CONFIG), cheap.trace)  # and claims the spec's config


def _with_config(state: TrainState, config: dict) -> TrainState:
    full = PPO.config(config).model_dump(mode="json")
    return TrainState(weights=dict(state.weights), rest={**state.rest, "runtime/config.json": json_tensor(full)})


def _nudged_rollout_rewards(state: TrainState, k: int) -> Execution:
    """Honest weights, but a reward scale the environment's rewards do not produce."""
    honest = execute(PPO, state, k)
    honest.state.rest["discounted_return"] = honest.state.rest["discounted_return"] + 1.0
    return honest


PPO_CHEATS = {
    **rl_cheats(PPO),
    "fewer_epochs": _fewer_epochs,
    "nudged_reward_scale": _nudged_rollout_rewards,
}


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("name", sorted(PPO_CHEATS))
def test_each_cheat_is_caught(name, k, honest, calibration, tmp_path):
    run, j = honest[k], START // k
    executed = PPO_CHEATS[name](run.states[j], k)
    report, segment = audit_one(with_segment(run, j, executed), j, tmp_path, calibration)
    assert not report.passed, (name, segment)
    if name == "nudged_reward_scale":  # only the bit-exact state check sees it
        assert segment.exact_mismatches == ["discounted_return"] and segment.r <= segment.tau


def test_the_global_step_counter_is_checked_exactly(honest, calibration, tmp_path):
    run, j = honest[KS[0]], START // KS[0]
    executed = execute(PPO, run.states[j], KS[0])
    executed.state.rest["global_step"] = executed.state.rest["global_step"] + KS[0]  # claims twice the steps
    report, segment = audit_one(with_segment(run, j, executed), j, tmp_path, calibration)
    assert not report.passed and segment.exact_mismatches == ["global_step"]
    assert torch.equal(run.states[j + 1].rest["global_step"], torch.tensor(START + KS[0]))  # the honest count


HALF = 32
"""Segments half a rollout long: every other boundary falls mid-rollout, where S_i holds a partial rollout."""


@pytest.fixture(scope="module")
def half_rollouts() -> tuple[Run, object]:
    """A run in segments of 32 steps, and a calibration from bases whose 32 steps end mid-rollout after an update."""
    run = train(PPO, {**CONFIG, "steps": 448}, SEED, HALF)
    cfg = PPO.config(CONFIG)
    bases = [warm_state(PPO, cfg, SEED, 240), warm_state(PPO, cfg, SEED, 368)]
    return run, calibrate_states(PPO, bases, ks=[HALF])


def _rollout_changed(name: str, change) -> object:
    def segment(state: TrainState, k: int) -> Execution:
        honest = execute(PPO, state, k)
        rest = {**honest.state.rest, f"rollout/{name}": change(honest.state.rest[f"rollout/{name}"])}
        return Execution(TrainState(weights=honest.state.weights, rest=rest), honest.trace)

    return segment


ROLLOUT_TAMPERING = {
    "value": _rollout_changed("value", lambda v: v * 1.5),  # inflated baselines: other advantages in the coming update
    "logprob": _rollout_changed("logprob", lambda p: p - 0.1),  # other importance ratios
}


@pytest.mark.parametrize("field", sorted(ROLLOUT_TAMPERING))
def test_rigged_rollout_values_and_logprobs_are_refused(field, half_rollouts, tmp_path):
    run, calibration = half_rollouts
    j = START // HALF  # 384 → 416: no update yet, the rollout holds the segment's 32 steps
    honest_report, _ = audit_one(run, j, tmp_path / "honest", calibration)
    assert honest_report.passed, honest_report.reasons
    executed = ROLLOUT_TAMPERING[field](run.states[j], HALF)
    report, segment = audit_one(with_segment(run, j, executed), j, tmp_path / field, calibration)
    assert not report.passed and f"S_{j + 1}'s rollout/{field} is not what these k steps produce" in segment.reasons[0]
    assert segment.r == 0  # no update in this segment: the weights are S_i's, as they must be
