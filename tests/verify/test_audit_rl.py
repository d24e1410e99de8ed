"""The learner audit on Double DQN with prioritized replay (CartPole): docs/protocol.md §6.

One honest run is trained once; each test replaces one mid-training segment j (after learning
started) by what an honest-but-different or a cheating executor commits, and audits segment j at
k = 25 and k = 100.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from trainmaster.jobs.decisions import DecisionLog, DecisionTrace
from trainmaster.jobs.execution import build_trainer, full_state, restore, run_step, state_info
from trainmaster.jobs.recipes import get_recipe
from trainmaster.jobs.replay import replay_state
from trainmaster.jobs.state import TrainState
from trainmaster.verify.calibrate import calibrate_states
from trainmaster.verify.distance import weight_distance
from trainmaster.verify.audit import run_audit
from trainmaster.verify.openings import LocalOpenings
from trainmaster.verify.variants import FREEZES, HONEST_VARIANTS, Execution, execute

from audit_support import Run, audit_one, commit, rl_cheats, train, variant_segments, walking_to, with_segment

pytestmark = pytest.mark.slow

DQN = get_recipe("dqn")
CONFIG = {
    "steps": 1000, "learning_starts": 200, "buffer_size": 2000, "batch_size": 64, "lr": 1e-3, "hidden": 64,
    "eps_start": 1.0, "eps_end": 0.05, "eps_fraction": 0.25, "tau": 0.01, "alpha": 0.6, "beta_start": 0.4,
}
"""Pinned in full: whether a plain replay breaks at a given start depends on every near-tie of the run."""
CONFIG_JSON = DQN.config(CONFIG).model_dump(mode="json")
SEED = 4
KS = (25, 100)
START = 600
"""The audited segment starts here, 400 steps into learning (a plain replay of k = 100 breaks from here)."""


def coarsen(run: Run, factor: int) -> Run:
    """The same run committed with segments ``factor`` times longer."""
    traces = [
        DecisionTrace.from_tensors({n: t for trace in run.traces[i : i + factor] for n, t in trace.to_tensors().items()})
        for i in range(0, run.n, factor)
    ]
    return Run(run.recipe, run.seed, run.k * factor, run.states[::factor], traces)


@pytest.fixture(scope="module")
def honest() -> dict[int, Run]:
    run = train(DQN, CONFIG, SEED, KS[0])
    return {k: coarsen(run, k // KS[0]) for k in KS}


@pytest.fixture(scope="module")
def calibration(honest):
    run = honest[KS[0]]
    bases = [run.states[500 // run.k], run.states[800 // run.k]]
    return calibrate_states(DQN, bases, ks=KS)


def test_the_learner_audit_separates_where_a_plain_replay_cannot(calibration):
    for k in KS:
        point = calibration.point(k)
        assert point.separation >= 10, (k, point)
        assert point.honest_max_margin <= point.margin_tol


@pytest.mark.parametrize("k", KS)
def test_honest_but_different_executors_pass_the_learner_audit(k, honest, calibration, tmp_path):
    run, j = honest[k], START // k
    plain = []
    for variant in HONEST_VARIANTS:
        executed = execute(DQN, run.states[j], k, variant)
        report, segment = audit_one(with_segment(run, j, executed), j, tmp_path / variant.name, calibration)
        assert report.passed, (variant.name, report.reasons)
        assert segment.exact_compared > 0 and segment.exact_mismatches == []
        assert segment.decisions.compared > 0 and segment.decisions.max_margin <= segment.decisions.margin_tol
        plain.append(_plain_replay_r(run.states[j], k, executed))
    if k == 100:  # a plain replay (decisions not forced) would have rejected an honest executor
        assert max(plain) > calibration.tau(k), plain


def _plain_replay_r(state: TrainState, k: int, executed: Execution) -> float:
    replay = replay_state(DQN, state, k, None, CONFIG_JSON)
    return weight_distance(state.weights, replay.weights, executed.state.weights).r


def _patched(patch) -> Callable[[TrainState, int], Execution]:
    """An executor running the recipe with ``patch(trainer)`` applied after restoring S_i."""

    def segment(state: TrainState, k: int) -> Execution:
        info = state_info(state)
        config = DQN.config(info.config)
        trainer = build_trainer(DQN, config, info.seed)
        restore(trainer, state)
        patch(trainer)
        log = DecisionLog()
        for step in range(info.step, info.step + k):
            run_step(trainer, info.seed, step, log)
        return Execution(full_state(trainer, DQN, config, info.seed, info.step + k).snapshot(), log.trace)

    return segment


def _drop_new_transitions(trainer) -> None:
    """Trains on the old buffer only (the transitions never enter it)."""
    trainer.buffer.add = lambda *args, **kwargs: None


def _skip_every_2nd_optimizer_step(trainer) -> None:
    """The decisions (a*, replay indices) are still computed and recorded; half the updates are not applied."""
    step, calls = trainer.optimizer.step, iter(range(10**9))
    trainer.optimizer.step = lambda *args, **kwargs: step(*args, **kwargs) if next(calls) % 2 == 0 else None


def _nudged_environment(state: TrainState, k: int) -> Execution:
    """Honest weights, but an environment state that the recorded actions do not produce."""
    honest = execute(DQN, state, k)
    physics = honest.state.rest["env/physics"]
    honest.state.rest["env/physics"] = torch.nextafter(physics, physics + 1)
    return honest


def _tampered(change: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[TrainState, int], Execution]:
    """Honest weights and decisions, but ``change`` applied to the committed rest of S_{i+1}."""

    def segment(state: TrainState, k: int) -> Execution:
        honest = execute(DQN, state, k)
        rest = dict(honest.state.rest)
        change(rest)
        return Execution(TrainState(weights=honest.state.weights, rest=rest), honest.trace)

    return segment


def _rig_priorities(rest: dict[str, torch.Tensor]) -> None:
    """The first 64 transitions 1000× likelier to be replayed."""
    priority = rest["replay/priority"].clone()
    priority[:64] *= 1000
    rest["replay/priority"] = priority


def _scale_target(factor: float) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(rest: dict[str, torch.Tensor]) -> None:
        rest.update({n: t * factor for n, t in rest.items() if n.startswith("target/")})

    return change


STATE_TAMPERING = {
    "rigged_priorities": (_tampered(_rig_priorities), "replay/priority"),
    "zeroed_target": (_tampered(_scale_target(0.0)), "target/*"),
    "negated_target": (_tampered(_scale_target(-1.0)), "target/*"),
    "frozen_after": (rl_cheats(DQN)["frozen_after"], "optimizer/state/*/exp_avg_sq"),
    "eps_1e30": (rl_cheats(DQN)["eps_1e30"], "optimizer/param_groups.json: [0].eps is 1e+30, not 1e-08"),
}
RL_CHEATS = {
    **rl_cheats(DQN),
    "no_new_transitions": _patched(_drop_new_transitions),
    "skip_gradient_steps": _patched(_skip_every_2nd_optimizer_step),
    "nudged_environment": _nudged_environment,
    **{name: segment for name, (segment, _) in STATE_TAMPERING.items()},
}


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("name", sorted(RL_CHEATS))
def test_each_cheat_is_caught_by_the_learner_audit(name, k, honest, calibration, tmp_path):
    run, j = honest[k], START // k
    executed = RL_CHEATS[name](run.states[j], k)
    report, segment = audit_one(with_segment(run, j, executed), j, tmp_path, calibration)
    assert not report.passed, (name, segment)
    if name == "nudged_environment":  # only the bit-exact environment check sees it
        assert segment.exact_mismatches == ["env/physics"] and segment.r <= segment.tau
    if name == "no_new_transitions":  # same weights (old indices only), but the buffer and the draws give it away
        assert "replay/obs" in segment.exact_mismatches and segment.decisions.max_margin > segment.decisions.margin_tol


@pytest.mark.parametrize("name", sorted(STATE_TAMPERING))
def test_state_tampering_is_refused_naming_the_entry(name, honest, calibration, tmp_path):
    """Weights and decisions honest; only a committed entry of S_{i+1} is not what the segment produced."""
    k = KS[0]
    run, j = honest[k], START // k
    segment_fn, entry = STATE_TAMPERING[name]
    report, segment = audit_one(with_segment(run, j, segment_fn(run.states[j], k)), j, tmp_path, calibration)
    assert not report.passed and entry in " ".join(segment.reasons), segment.reasons
    if name != "eps_1e30":  # the one that also trained differently
        assert segment.r <= segment.tau  # the weights alone would have passed


def test_delivering_a_policy_cached_from_another_seed_is_refused(honest, calibration, tmp_path):
    """Every segment frozen through eps = 1e30, then an S_{n−1} whose Adam moments walk the online network to
    another seed's trained policy: the always-audited first segment catches the freeze."""
    k = KS[0]
    run = train(DQN, CONFIG, SEED, k, variant_segments(DQN, k, FREEZES[0]))
    target = train(DQN, CONFIG, SEED + 1, k).states[-1].weights
    last = run.n - 1
    spec_groups = honest[k].states[last].rest["optimizer/param_groups.json"]
    unfrozen = TrainState(run.states[last].weights, {**run.states[last].rest, "optimizer/param_groups.json": spec_groups})
    run.states[last] = walking_to(DQN, unfrozen, k, target)
    delivered = execute(DQN, run.states[last], k)
    run.states[-1], run.traces[-1] = delivered.state, delivered.trace
    gap = sum(float((delivered.state.weights[n] - target[n]).square().sum()) for n in target) ** 0.5
    start_gap = sum(float((unfrozen.weights[n] - target[n]).square().sum()) for n in target) ** 0.5
    assert gap < 0.05 * start_gap  # the cached policy is delivered
    report = run_audit(
        commitment=commit(run, tmp_path), openings=LocalOpenings(tmp_path), segments=[0, last],
        recipe="dqn", config=CONFIG, seed=SEED, calibration=calibration,
    )
    assert not report.segments[0].passed
    assert "optimizer/param_groups.json: [0].eps is 1e+30, not 1e-08" in report.segments[0].reasons[0]
    assert not report.segments[1].passed and "|m| / √v reaches" in report.segments[1].reasons[0]
