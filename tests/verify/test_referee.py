"""The refereed tier's parts (docs/protocol.md §3c), below the CLI (tests/e2e/test_refereed_tier_cli.py runs it end to
end): the bisection finds the first leaf where two trees differ in ⌈log₂ m⌉ openings, whatever happens after it;
openings that do not stand are forfeits; the dispute's one replay upholds an honest run and refutes a tampered one
bit for bit; the miner's leaf openings reach its signed root; the planner draws a pair of different coldkeys."""

from __future__ import annotations

import hashlib
import math
import random
import shutil
from pathlib import Path

import pytest
import torch

from trainmaster.backends.base import Offer
from trainmaster.backends.segments import LeavesUnreadable, leaf_openings
from trainmaster.broker.planning.planner import CHOSEN, Considered, Plan
from trainmaster.broker.planning.referee_pair import PARTNER, pair_up
from trainmaster.jobs.checkpoint import read_segment, segment_dir
from trainmaster.jobs.merkle import inclusion_proof, merkle_root
from trainmaster.jobs.runtime import run
from trainmaster.jobs.settings import RuntimeSettings
from trainmaster.jobs.spec import JobSpec
from trainmaster.jobs.state import TrainState
from trainmaster.verify.recipe_run import recipe_run
from trainmaster.verify.referee import Bisection, Forfeit, OpenedLeaf, check_opening, dispute, judge, leaf_of
from trainmaster.verify.referee_replay import DisputeReplay, replay_dispute

from tampered_runs import continue_from

# the bisection, on synthetic trees


def _digest(tag: str) -> str:
    return hashlib.sha256(tag.encode()).hexdigest()


def _tree(m: int, side: str, differing: set[int]) -> tuple[list[dict], str]:
    """m leaves' openings (weights, rest, trace digests) of one side: leaves in `differing` are its own."""
    parts = [(_digest(f"w{i}{side if i in differing else ''}"), _digest(f"r{i}"), _digest(f"t{i}")) for i in range(m)]
    leaves = [bytes.fromhex(leaf_of(*p)) for p in parts]
    openings = [{"index": i, "weights": w, "rest": r, "trace": t, "proof": [h.hex() for h in inclusion_proof(leaves, i)]}
                for i, (w, r, t) in enumerate(parts)]
    return openings, merkle_root(leaves).hex()


def _bisect(m: int, differing: set[int]) -> tuple[int, int]:
    (a, root_a), (b, root_b) = _tree(m, "a", differing), _tree(m, "b", differing)
    bisection, asked = Bisection(m), 0
    while not bisection.done:
        i = bisection.probe()
        bisection.record(i, check_opening(root_a, m, i, a[i]), check_opening(root_b, m, i, b[i]))
        asked += 1
    return bisection.first_differing, asked


@pytest.mark.parametrize("m", [2, 3, 5, 8, 21, 401])
def test_the_bisection_finds_the_first_differing_leaf_in_log_m_openings(m):
    rng = random.Random(m)
    for j in sorted({0, m - 1, *rng.sample(range(m), min(m, 12))}):
        found, asked = _bisect(m, {j} | set(range(j, m, 3)))  # parts again after j, and agrees again: not monotone
        assert found == j
        assert asked <= math.ceil(math.log2(m))


def test_an_opening_that_does_not_stand_is_a_forfeit():
    openings, root = _tree(9, "a", {4})
    good = openings[4]
    assert check_opening(root, 9, 4, good)[0].leaf == leaf_of(good["weights"], good["rest"], good["trace"])
    flipped = {**good, "proof": [good["proof"][0][:-1] + ("0" if good["proof"][0][-1] != "0" else "1"), *good["proof"][1:]]}
    other_state = {**good, "weights": _digest("not committed")}
    cases = {
        "asked for leaf 4, it opened leaf 3": openings[3],
        "does not reach the committed root": flipped,
        "does not reach the committed root ": other_state,
        "not 64 lowercase hex digits": {**good, "rest": good["rest"].upper()},
        "malformed": {k: v for k, v in good.items() if k != "trace"},
        "does not reach the committed root  ": {**good, "proof": good["proof"] + [root]},
    }
    for reason, opening in cases.items():
        with pytest.raises(Forfeit, match=reason.strip()):
            check_opening(root, 9, 4, opening)


def test_what_the_replay_settles_at_the_first_differing_leaf():
    def leaf(i, w="w", r="r", t="t"):
        return OpenedLeaf(i, _digest(w), _digest(r), _digest(t), leaf_of(_digest(w), _digest(r), _digest(t)))

    assert dispute(0, leaf(0, w="a"), leaf(0, w="b")).compared == "initial"
    found = dispute(5, leaf(5, r="a"), leaf(5, r="b"))
    assert (found.compared, found.segment, found.opened_state) == ("state", 4, 4)
    found = dispute(5, leaf(5, t="a"), leaf(5, t="b"))  # the same S_5, other decisions in segment 5
    assert (found.compared, found.segment, found.opened_state) == ("trace", 5, 5)
    replayed = {"weights": _digest("w"), "rest": _digest("r")}
    assert judge("state", replayed, {"x": leaf(5), "y": leaf(5, w="pushed")}) == {"x": "upheld", "y": "refuted"}
    assert judge("state", replayed, {"x": leaf(5, r="a"), "y": leaf(5, w="b")}) == {"x": "refuted", "y": "refuted"}


# one replayed segment, on real runs

K, N, J = 2, 10, 6
ENTRY = "python -m trainmaster.jobs.recipes.tiny_lm --steps 20 --d-model 16 --heads 2 --seq-len 8 --batch-size 2"
SPEC = JobSpec(name="lm", entrypoint=ENTRY, seed=3, checkpoint={"segment_steps": K})
SEED = 11  # the pair's seed (an untrusted attempt's, from the broker's nonce)


def _run(root: Path):
    job = recipe_run(SPEC)
    settings = RuntimeSettings(job_id="j", output_dir=root / "out", checkpoint_dir=root / "ckpt", seed=SEED,
                               segment_steps=K, bundle_sha256="0" * 64)
    return run(job.recipe, job.recipe.config(job.config), settings).commitment


def _nudged(honest: Path, root: Path):
    """The honest run up to S_J, its weights pushed by 1e-7 at S_J, trained on honestly from there."""
    job = recipe_run(SPEC)
    recipe, cfg = job.recipe, job.recipe.config(job.config)
    shutil.copytree(honest / "ckpt", root / "ckpt")
    for stale in range(J, N + 1):
        shutil.rmtree(segment_dir(root / "ckpt", stale))
    state = read_segment(segment_dir(honest / "ckpt", J)).state
    nudged = TrainState({n: t + 1e-7 * torch.sign(t) for n, t in state.weights.items()}, dict(state.rest))
    return continue_from(root / "ckpt", recipe, cfg, nudged, J, n=N, k=K, seed=SEED, job_id="j",
                         record_environment=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    honest, nudged = tmp_path_factory.mktemp("honest"), tmp_path_factory.mktemp("nudged")
    return (honest, _run(honest)), (nudged, _nudged(honest, nudged))


def _opened(root: Path, commitment, index: int) -> dict:
    [opening] = leaf_openings(root / "ckpt", [index])
    return opening


def test_the_miners_leaf_openings_reach_its_signed_root(runs, tmp_path):
    (honest, commitment), _ = runs
    assert commitment.deterministic and commitment.deterministic.startswith("torch ")
    for i in range(N + 1):
        leaf, nodes = check_opening(commitment.root, N + 1, i, _opened(honest, commitment, i))
        assert nodes[(0, N + 1)].hex() == commitment.root
    shutil.copytree(honest / "ckpt", tmp_path / "ckpt")
    shutil.rmtree(segment_dir(tmp_path / "ckpt", 4))
    with pytest.raises(LeavesUnreadable, match="segment 4 is missing"):
        leaf_openings(tmp_path / "ckpt", [1])
    with pytest.raises(LeavesUnreadable, match="outside the run's"):
        leaf_openings(honest / "ckpt", [N + 1])


def test_one_replayed_segment_upholds_the_honest_run_and_refutes_the_pushed_one(runs):
    (honest, good), (nudged, bad) = runs
    assert good.root != bad.root and good.deterministic == bad.deterministic
    bisection = Bisection(N + 1)
    while not bisection.done or bisection.needed():
        wanted = [bisection.probe()] if not bisection.done else bisection.needed()
        for i in wanted:
            bisection.record(i, check_opening(good.root, N + 1, i, _opened(honest, good, i)),
                             check_opening(bad.root, N + 1, i, _opened(nudged, bad, i)))
    j = bisection.first_differing
    assert j == J and {J - 1, J} <= set(bisection.opened)
    found = dispute(j, *bisection.opened[j])
    assert (found.compared, found.segment) == ("state", J - 1)
    replayed = replay_dispute(DisputeReplay(
        spec_json=SPEC.model_dump_json(), seed=SEED, compared=found.compared, segment=found.segment,
        opened_state=found.opened_state, commitment=bad.canonical_json(), openings_dir=str(nudged / "ckpt")))
    assert replayed["verifier"] == good.deterministic, replayed
    sides = {"honest": bisection.opened[j][0], "nudged": bisection.opened[j][1]}
    assert judge(found.compared, replayed, sides) == {"honest": "upheld", "nudged": "refuted"}
    initial = replay_dispute(DisputeReplay(spec_json=SPEC.model_dump_json(), seed=SEED, compared="initial",
                                           segment=None, opened_state=None))
    zero = check_opening(good.root, N + 1, 0, _opened(honest, good, 0))[0]
    assert (initial["weights"], initial["rest"]) == zero.state  # the broker's own S_0 is the honest one's


def test_an_opening_of_the_agreed_state_that_is_not_committed_is_the_opened_sides_fault(runs, tmp_path):
    (honest, good), _ = runs
    shutil.copytree(honest / "ckpt", tmp_path / "ckpt")
    weights = segment_dir(tmp_path / "ckpt", J - 1) / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    replayed = replay_dispute(DisputeReplay(
        spec_json=SPEC.model_dump_json(), seed=SEED, compared="state", segment=J - 1, opened_state=J - 1,
        commitment=good.canonical_json(), openings_dir=str(tmp_path / "ckpt")))
    assert replayed["blame"] == "opened" and "does not match leaf" in replayed["failed"], replayed
    own = JobSpec(name="lm", entrypoint="python train.py", recipe="train:RECIPE", seed=3,
                  checkpoint={"segment_steps": K})
    ours = replay_dispute(DisputeReplay(spec_json=own.model_dump_json(), seed=SEED, compared="initial", segment=None,
                                        opened_state=None))
    assert ours["blame"] == "ours" and "own recipe" in ours["failed"]


# the pair the planner draws


def _row(i: int, coldkey: str | None, cost: int = 100, gpu: str | None = None, trusted: bool = False) -> Considered:
    offer = Offer(backend="local" if trusted else "bittensor", instance=f"hot{i}", price_per_hour_micro_usd=cost,
                  gpu_type=gpu, trusted=trusted, detail={"coldkey": coldkey} if coldkey else {})
    return Considered(offer, 1.0, cost, CHOSEN if i == 0 else "costlier than the chosen offer", 0, cost)


def _plan(rows: list[Considered]) -> Plan:
    return Plan(rows=rows, ranked=len(rows))


def test_the_pair_is_two_coldkeys_drawn_at_random_and_costs_their_sum():
    drawn = set()
    for seed in range(30):
        rng = random.Random(seed)
        plan = _plan([_row(0, "c0", 100), _row(1, "c0", 110), _row(2, "c1", 120), _row(3, None, 90),
                      _row(4, "c2", 130, gpu="H100")])
        pair_up(plan, SPEC, draw=rng.randrange)
        first, second = plan.rows[0], plan.partner
        assert first.verdict == CHOSEN and second.verdict == PARTNER and plan.rows[1] is second
        assert first.offer.detail["coldkey"] != second.offer.detail["coldkey"]
        assert {first.offer.instance, second.offer.instance} <= {"hot0", "hot1", "hot2"}  # same hardware, coldkey known
        assert "about 2× a single run" in plan.notes[-1]
        drawn.add(first.offer.instance)
    assert len(drawn) == 3  # not always the cheapest


def test_no_pair_without_two_coldkeys_and_none_needed_on_trusted_compute():
    plan = _plan([_row(0, "c0"), _row(1, "c0"), _row(2, None)])
    pair_up(plan, SPEC)
    assert plan.chosen is None and plan.partner is None
    assert "needs two miners of different coldkeys" in plan.explain_failure()
    trusted = _plan([_row(0, None, trusted=True), _row(1, "c1")])
    pair_up(trusted, SPEC)
    assert trusted.chosen.offer.trusted and trusted.partner is None and "not refereed" in trusted.notes[-1]
    capped = _plan([_row(0, "c0", 100), _row(1, "c1", 100), _row(2, "c2", 10_000)])
    pair_up(capped, SPEC.model_copy(update={"limits": SPEC.limits.model_copy(update={"max_usd": 250})}),
            draw=lambda n: n - 1)  # a random pair over the cap: the cheapest two instead
    assert {capped.rows[0].offer.instance, capped.partner.offer.instance} == {"hot0", "hot1"}
