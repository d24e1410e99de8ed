"""The planner: constraints, expected cost, objectives, fallbacks in order, and the considered table.

The property tests compare the planner with a brute force written from the documented formula
(docs/policy.md): each offer judged on its own, costs in exact integer arithmetic.
"""

from __future__ import annotations

import asyncio
import gc
import random
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from math import ceil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from trainmaster.backends.base import Backend, Offer, OfferRequest, OfferSet
from trainmaster.broker.cli.plan_table import render_plan
from trainmaster.broker.planning.planner import PlanError, gather_offers, plan, reference_hours
from trainmaster.broker.planning.policy import Policy, tier_name
from trainmaster.jobs.spec import JobSpec

BACKENDS = ["local", "bittensor", "aws", "gcp", "azure"]
SPEED = {"A100": 1, "H100": 3, "A40": Fraction(1, 2)}  # the table's figures for the GPUs used here
NOW = datetime(2026, 6, 1, tzinfo=timezone.utc)


def offer(backend="aws", price=1_000_000, *, instance="i", spot=False, region="us-east-1", gpu="A100", gpus=1,
          start=0, nodes=1, cpus=8, trusted=None, **kw) -> Offer:
    return Offer(backend=backend, instance=instance, region=region, gpu_type=gpu, gpu_count=gpus, spot=spot,
                 price_per_hour_micro_usd=price, expected_start_s=start, nodes=nodes, cpus=cpus,
                 trusted=backend != "bittensor" if trusted is None else trusted, **kw)


def sets(*offers: Offer) -> list[OfferSet]:
    by: dict[str, list[Offer]] = {}
    for o in offers:
        by.setdefault(o.backend, []).append(o)
    return [OfferSet(backend=b, offers=os) for b, os in by.items()]


def policy(**cls) -> Policy:
    return Policy.model_validate({"name": "t", "default": cls})


def spec(**kw) -> JobSpec:
    kw.setdefault("resources", {"gpus": 1})
    return JobSpec(name="t", entrypoint="python t.py", **kw)


# --- the brute force -------------------------------------------------------------------------------

def runtime_s(o: Offer, s: JobSpec) -> int:
    base = Fraction(str(s.estimated_hours or 1)) * 3600
    return ceil(base / SPEED[o.gpu_type]) if s.resources.gpus else ceil(base)


def expected(o: Offer, s: JobSpec, rates: dict[str, float]) -> int:
    compute = ceil(Fraction(o.price_per_hour_micro_usd * o.nodes * runtime_s(o, s), 3600))
    audited = s.verification.replay_audit == "always" or (s.verification.replay_audit == "auto" and not o.trusted)
    q, k = s.verification.challenge_segments, s.checkpoint.segment_steps
    audit = ceil(Fraction(compute * (q + 2) * k, 400 * k)) if audited else 0
    rate = rates.get(f"{o.backend}:{'spot' if o.spot else 'on-demand'}", rates.get(o.backend, 0.0))
    risk = ceil(Fraction(compute * round(rate * 1_000_000), 1_000_000))
    return compute + audit + risk


def tier_of(o: Offer, p: Policy, s: JobSpec) -> int | None:
    for i, tier in enumerate(p.for_class(s.workload).tiers):
        if any(step.backend == o.backend and step.admits_spot(o.spot) for step in tier):
            return i
    return None


def acceptable(o: Offer, p: Policy, s: JobSpec, rates, blocked=frozenset()) -> bool:
    """Every constraint, checked offer by offer."""
    cls = p.for_class(s.workload)
    c, res, lim = cls.constraints, s.resources, s.limits
    caps = [x for x in (c.max_usd_per_hour, lim.max_usd_per_hour) if x is not None]
    return (
        o.key not in blocked and o.backend not in blocked
        and tier_of(o, p, s) is not None
        and (not (p.local_only or c.local_only) or o.backend == "local")
        and (c.allowed_backends is None or o.backend in c.allowed_backends)
        and (c.spot_allowed or not o.spot)
        and (c.regions is None or any(o.region == r or (r.endswith("*") and o.region.startswith(r[:-1])) for r in c.regions))
        and (not res.gpus or not c.gpu_types or o.gpu_type in c.gpu_types)
        and (not res.gpus or not res.gpu_types or o.gpu_type in res.gpu_types)
        and o.gpu_count >= res.gpus and o.cpus >= res.cpus and o.nodes >= res.nodes
        and all(o.price_per_hour_micro_usd * o.nodes <= cap for cap in caps)
        and (lim.max_usd is None or expected(o, s, rates) <= lim.max_usd)
        and (lim.max_hours is None or runtime_s(o, s) <= lim.max_hours * 3600)
    )


# --- strategies ------------------------------------------------------------------------------------

@st.composite
def offers_st(draw, max_size=25) -> list[Offer]:
    n = draw(st.integers(0, max_size))
    result = []
    for i in range(n):
        backend = draw(st.sampled_from(BACKENDS))
        result.append(offer(
            backend, draw(st.integers(0, 40_000_000)), instance=f"i{i}",
            spot=backend != "local" and draw(st.booleans()),
            region="local" if backend == "local" else draw(st.sampled_from(["us-east-1", "us-west-2", "eu-west-1"])),
            gpu=draw(st.sampled_from(sorted(SPEED))), gpus=draw(st.sampled_from([1, 2, 4, 8])),
            start=draw(st.integers(0, 3600)), nodes=draw(st.sampled_from([1, 1, 2])), cpus=draw(st.sampled_from([2, 8, 96])),
        ))
    return result


@st.composite
def class_st(draw, *, one_tier=False, unconstrained=False) -> dict:
    local_only = draw(st.booleans()) and not one_tier and not unconstrained
    spot_allowed = draw(st.booleans())
    if local_only:
        tiers = [["local"]]
    else:
        chain = draw(st.permutations(BACKENDS))[: draw(st.integers(1, 5))]
        steps = []
        for b in chain:
            capacities = [""] if b == "local" else ["", ":on-demand"] + ([":spot"] if spot_allowed else [])
            steps.append(b + draw(st.sampled_from(capacities)))
        if one_tier:
            tiers = [steps]
        else:
            cuts = sorted(draw(st.sets(st.integers(1, max(1, len(steps) - 1)), max_size=len(steps) - 1)))
            tiers = [steps[a:b] for a, b in zip([0, *cuts], [*cuts, len(steps)]) if steps[a:b]]
    backends = {s.split(":")[0] for t in tiers for s in t}
    constraints = {"spot_allowed": spot_allowed, "local_only": local_only}
    if unconstrained:
        return {"objective": "cheapest", "primary": tiers[0], "fallbacks": tiers[1:], "constraints": constraints}
    if draw(st.booleans()):
        constraints["allowed_backends"] = sorted(backends | set(draw(st.sets(st.sampled_from(BACKENDS)))))
    if draw(st.booleans()):
        constraints["regions"] = sorted(set(draw(st.lists(st.sampled_from(["us-*", "eu-west-1"]), min_size=1))) | {"local"})
    if draw(st.booleans()):
        constraints["gpu_types"] = draw(st.lists(st.sampled_from(sorted(SPEED)), min_size=1, unique=True))
    if draw(st.booleans()):
        constraints["max_usd_per_hour"] = draw(st.integers(1, 60))
    return {"objective": "cheapest", "primary": tiers[0], "fallbacks": tiers[1:], "constraints": constraints}


@st.composite
def spec_st(draw) -> JobSpec:
    limits = {}
    if draw(st.booleans()):
        limits["max_usd_per_hour"] = draw(st.integers(1, 80))
    if draw(st.booleans()):
        limits["max_usd"] = draw(st.integers(1, 2000))
    if draw(st.booleans()):
        limits["max_hours"] = draw(st.sampled_from([1, 10, 40]))
    return spec(
        resources={"gpus": draw(st.sampled_from([0, 1, 2, 8])), "cpus": draw(st.sampled_from([1, 4, 16])),
                   "gpu_types": draw(st.lists(st.sampled_from(sorted(SPEED)), unique=True, max_size=2))},
        estimated_hours=draw(st.sampled_from([1, 3, 20, 50])), limits=limits,
        verification={"replay_audit": draw(st.sampled_from(["auto", "always", "never"]))},
    )


RATES = st.dictionaries(st.sampled_from(["bittensor", "aws:spot", "gcp", "azure:on-demand"]),
                        st.floats(0, 0.5, allow_nan=False), max_size=3)
FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- properties ------------------------------------------------------------------------------------

@FAST
@given(offers_st(), class_st(), spec_st(), RATES)
def test_never_picks_an_offer_that_breaks_a_constraint_and_never_misses_one(offers, cls, s, rates):
    p = policy(**cls)
    result = plan(s, p, sets(*offers), failure_rates=rates)
    feasible = [o for o in offers if acceptable(o, p, s, rates)]
    if result.chosen is None:
        assert feasible == []
    else:
        assert acceptable(result.chosen.offer, p, s, rates)
    assert len(result.rows) == len(offers)
    assert sum(r.verdict == "chosen" for r in result.rows) == (1 if feasible else 0)


@FAST
@given(offers_st(), class_st(one_tier=True), spec_st(), RATES)
def test_cheapest_equals_the_brute_force_minimum(offers, cls, s, rates):
    p = policy(**cls)
    result = plan(s, p, sets(*offers), failure_rates=rates)
    costs = [expected(o, s, rates) for o in offers if acceptable(o, p, s, rates)]
    assert (result.chosen.expected_micro_usd if result.chosen else None) == (min(costs) if costs else None)
    for row in result.rows:
        assert row.expected_micro_usd == expected(row.offer, s, rates)


@FAST
@given(offers_st(max_size=12), class_st(unconstrained=True), st.sampled_from([1, 3, 20]))
def test_fallbacks_are_tried_in_order_down_to_the_last_offer(offers, cls, hours):
    p, s = policy(**cls), spec(estimated_hours=hours)
    feasible = [o for o in offers if acceptable(o, p, s, {})]
    blocked, tiers = frozenset(), []
    for _ in feasible:
        chosen = plan(s, p, sets(*offers), blocked=blocked).chosen
        assert chosen is not None
        tier = tier_of(chosen.offer, p, s)
        # the cheapest offer of the first tier that still has one
        remaining = [o for o in feasible if o.key not in blocked]
        first = min(tier_of(o, p, s) for o in remaining)
        assert tier == first
        assert chosen.expected_micro_usd == min(expected(o, s, {}) for o in remaining if tier_of(o, p, s) == first)
        tiers.append(tier)
        blocked |= {chosen.offer.key}
    assert tiers == sorted(tiers)
    final = plan(s, p, sets(*offers), blocked=blocked)
    assert final.chosen is None
    with pytest.raises(PlanError):
        raise PlanError(final)


def reference_rows(offer_sets: list[OfferSet], p: Policy, s: JobSpec, rates: dict[str, float]) -> list[tuple[str, str]]:
    """(offer key, verdict) of every row, the straightforward way: each feasible offer costed on its own
    and sorted on (tier, objective's key, order given), then every infeasible one in the order given."""
    cls = p.for_class(s.workload)
    flat = [o for offer_set in offer_sets for o in offer_set.offers]
    ranked = []
    for i, o in enumerate(flat):
        if acceptable(o, p, s, rates):
            cost, finish = expected(o, s, rates), o.expected_start_s + runtime_s(o, s)
            ranked.append((tier_of(o, p, s), (finish, cost) if cls.objective == "fastest" else (cost, finish), i, o))
    ranked.sort(key=lambda r: r[:3])
    rows = []
    for tier, key, _, o in ranked:
        if not rows:
            best_tier, best_key, verdict = tier, key, "chosen"
        elif tier != best_tier:
            verdict = f"fallback {tier_name(cls.tiers[tier])} is not needed while {tier_name(cls.tiers[best_tier])} has an offer"
        elif key[0] != best_key[0]:
            verdict = "finishes later than the chosen offer" if cls.objective == "fastest" else "costlier than the chosen offer"
        elif key[1] != best_key[1]:
            verdict = "costlier at the same finish time" if cls.objective == "fastest" else "same cost, finishes later"
        else:
            verdict = "tie: the chosen offer came first"
        rows.append((o.key, verdict))
    return rows + [(o.key, None) for o in flat if not acceptable(o, p, s, rates)]


@pytest.mark.parametrize("objective", ["cheapest", "fastest"])
def test_ranking_of_thousands_of_offers_is_the_straightforward_sort(objective):
    """The planner's hot loop and sort (tuned for 100,000 offers) against `reference_rows`, on 4,000
    seeded offers with few distinct prices and start times, so costs and finish times tie often."""
    rng = random.Random(2024)
    offers = []
    for i in range(4000):
        backend = rng.choice(BACKENDS)
        offers.append(offer(
            backend, rng.choice([900_000, 1_000_000, 1_500_000, 2_000_000, 4_000_000]), instance=f"i{i}",
            spot=backend != "local" and rng.random() < 0.5,
            region="local" if backend == "local" else rng.choice(["us-east-1", "us-west-2", "eu-west-1"]),
            gpu=rng.choice(sorted(SPEED)), gpus=rng.choice([1, 2, 4]), start=rng.choice([0, 0, 60, 600]),
            nodes=rng.choice([1, 1, 2]), cpus=rng.choice([2, 8]),
        ))
    p = policy(objective=objective, primary=["bittensor", "local"], fallbacks=[["aws:spot", "gcp:spot"], "azure"],
               constraints={"regions": ["us-*", "local"], "gpu_types": ["A100", "H100"], "max_usd_per_hour": 7})
    s = spec(resources={"gpus": 2, "cpus": 4}, estimated_hours=3, limits={"max_usd": 30})
    rates = {"bittensor": 0.1, "aws:spot": 0.05, "gcp": 0.08}
    offer_sets = sets(*offers)
    result = plan(s, p, offer_sets, failure_rates=rates)
    expected_rows = reference_rows(offer_sets, p, s, rates)
    feasible = sum(verdict is not None for _, verdict in expected_rows)
    assert 100 < feasible < 4000 - 100  # both parts are exercised
    got = [(r.offer.key, r.verdict) for r in result.rows]
    assert got[:feasible] == expected_rows[:feasible]
    assert [key for key, _ in got[feasible:]] == [key for key, _ in expected_rows[feasible:]]
    assert not {verdict for _, verdict in got[feasible:]} & {v for _, v in expected_rows[:feasible]}
    assert {v for _, v in got[:feasible]} >= {"chosen", "tie: the chosen offer came first"}
    for row in result.rows:
        assert row.expected_micro_usd == expected(row.offer, s, rates)
        assert row.finish_s == row.offer.expected_start_s + runtime_s(row.offer, s)


def test_plan_pauses_the_cyclic_gc_and_gives_it_back_as_it_was():
    s, p = spec(estimated_hours=1), policy(primary="aws")
    small, big = sets(offer("aws")), sets(*[offer("aws", 1_000_000 + i, instance=f"i{i}") for i in range(1500)])
    assert gc.isenabled()
    for offers in (small, big):  # a big plan also moves its rows to the oldest generation (freeze + unfreeze)
        assert plan(s, p, offers).chosen is not None
        assert gc.isenabled() and gc.get_freeze_count() == 0
        with pytest.raises(ValueError):
            plan(s, p, offers, failure_rates={"aws": 2.0})
        assert gc.isenabled()
    gc.disable()  # the caller's choice stands
    try:
        plan(s, p, big)
        assert not gc.isenabled()
    finally:
        gc.enable()
    gc.freeze()  # and so do objects someone else froze
    try:
        frozen = gc.get_freeze_count()
        plan(s, p, big)
        # nothing unfrozen, nothing more frozen; a thread of the suite's session-wide servers may free a frozen object
        assert frozen - 1000 < gc.get_freeze_count() <= frozen and gc.isenabled()
    finally:
        gc.unfreeze()


# --- examples --------------------------------------------------------------------------------------

def test_expected_cost_parts_by_hand():
    s = spec(resources={"gpus": 8}, estimated_hours=10, checkpoint={"segment_steps": 50},
             verification={"challenge_segments": 8},
             data=[{"name": "d", "source": "s3://bucket/data.tar"}])
    miner = offer("bittensor", 10_000_000, gpu="H100", gpus=8, instance="5F…")
    p = policy(primary="bittensor")
    [row] = plan(s, p, sets(miner), failure_rates={"bittensor": 0.1}, data_bytes={"d": 50 * 10**9},
                 total_steps=20_000).rows
    assert row.hours == pytest.approx(10 / 3)  # H100 = 3 × the A100 reference
    assert row.compute_micro_usd == 33_333_334  # $10/h × 12,000 s, rounded up
    assert row.verification_micro_usd == ceil(33_333_334 * 10 * 50 / 20_000)  # (q+2)·k/T = 2.5 %
    assert row.risk_micro_usd == 3_333_334  # 10 % of compute, rounded up
    assert row.transfer_micro_usd == 4_500_000  # 50 GB out of S3 at $0.09/GB
    assert row.expected_micro_usd == 33_333_334 + 833_334 + 3_333_334 + 4_500_000
    assert row.verdict == "chosen"


def test_trusted_offers_skip_the_audit_unless_always():
    s = spec(estimated_hours=1)
    cloud = offer("aws", 3_600_000)
    [row] = plan(s, policy(primary="aws"), sets(cloud)).rows
    assert row.verification_micro_usd == 0
    [row] = plan(spec(estimated_hours=1, verification={"replay_audit": "always"}), policy(primary="aws"), sets(cloud)).rows
    assert row.verification_micro_usd == ceil(3_600_000 * 10 / 400)


def test_runtime_basis_estimate_history_max_hours_default():
    h100 = offer("aws", 1_000_000, gpu="NVIDIA H100 80GB HBM3")
    p = policy(primary="aws")
    assert plan(spec(estimated_hours=6), p, sets(h100)).rows[0].hours == pytest.approx(2)
    from_history = plan(spec(workload="retraining"), p, sets(h100), history={"retraining": 9})
    assert from_history.rows[0].hours == pytest.approx(3) and "history of retraining" in from_history.basis
    bounded = plan(spec(limits={"max_hours": 0.5}), p, sets(h100))
    assert bounded.rows[0].hours == pytest.approx(0.5) and bounded.chosen and "max_hours" in bounded.basis
    unknown = plan(spec(), p, sets(offer("aws", 1_000_000, gpu="Mystery 9000")))
    assert unknown.rows[0].hours == 1 and any("MYSTERY 9000 is not in the throughput table" in n for n in unknown.notes)
    assert reference_hours(2, "H100") == 6


def test_fastest_and_cheapest_by_deadline():
    slow_cheap = offer("aws", 1_000_000, gpu="A100", instance="slow")
    fast_dear = offer("aws", 4_000_000, gpu="H100", instance="fast")
    s = spec(estimated_hours=30)
    assert plan(s, policy(primary="aws"), sets(slow_cheap, fast_dear)).chosen.offer.instance == "slow"
    assert plan(s, policy(primary="aws", objective="fastest"), sets(slow_cheap, fast_dear)).chosen.offer.instance == "fast"
    by_deadline = policy(primary="aws", objective="cheapest-by-deadline", deadline_hours=24)
    result = plan(s, by_deadline, sets(slow_cheap, fast_dear), now=NOW)
    assert result.chosen.offer.instance == "fast"
    assert {r.offer.instance: r.verdict for r in result.rows}["slow"] == "expected to finish after the deadline"
    roomy = spec(estimated_hours=30, limits={"deadline": (NOW + timedelta(hours=48)).isoformat()})
    assert plan(roomy, by_deadline, sets(slow_cheap, fast_dear), now=NOW).chosen.offer.instance == "slow"
    no_deadline = plan(s, policy(primary="aws", objective="cheapest-by-deadline"), sets(slow_cheap), now=NOW)
    assert no_deadline.chosen and "planned as cheapest" in no_deadline.notes[0]


def test_every_loser_says_why():
    p = policy(primary="bittensor", fallbacks=["aws:spot"],
               constraints={"max_usd_per_hour": 20, "gpu_types": ["A100", "H100"], "regions": ["us-*"]})
    s = spec(resources={"gpus": 2})
    offers = [
        offer("bittensor", 5_000_000, gpus=2, instance="best"),
        offer("bittensor", 6_000_000, gpus=2, instance="dearer"),
        offer("aws", 1_000_000, gpus=2, spot=True, instance="fallback"),
        offer("aws", 1_000_000, gpus=2, instance="on-demand"),
        offer("gcp", 1_000_000, gpus=2, instance="gcp"),
        offer("bittensor", 1_000_000, gpus=1, instance="small"),
        offer("bittensor", 1_000_000, gpus=2, gpu="A40", instance="a40"),
        offer("bittensor", 1_000_000, gpus=2, region="eu-west-1", instance="eu"),
        offer("bittensor", 21_000_000, gpus=2, instance="pricey"),
    ]
    verdicts = {r.offer.instance: r.verdict for r in plan(s, p, sets(*offers)).rows}
    assert verdicts == {
        "best": "chosen",
        "dearer": "costlier than the chosen offer",
        "fallback": "fallback aws:spot is not needed while bittensor has an offer",
        "on-demand": "the chain takes only aws:spot from aws, not on-demand",
        "gcp": "gcp is not in this class's chain (bittensor → aws:spot)",
        "small": "fewer than the 2 GPU(s) the job needs",
        "a40": "GPU A40 is not among the policy's A100/H100",
        "eu": "region eu-west-1 is not among the allowed us-*",
        "pricey": "over the $20.00/hour cap",
    }


def test_blocking_a_backend_by_name_and_local_only():
    offers = sets(offer("bittensor", 1, instance="m"), offer("aws", 5, spot=True, instance="a"))
    p = policy(primary="bittensor", fallbacks=["aws:spot"])
    assert plan(spec(), p, offers, blocked=frozenset({"bittensor"})).chosen.offer.backend == "aws"
    private = Policy.model_validate({"name": "t", "local_only": True, "default": {"primary": "local"}})
    result = plan(spec(), private, offers + sets(offer("local", 100, region="local")))
    assert result.chosen.offer.backend == "local"
    assert {r.verdict for r in result.rows[1:]} == {"leaves this machine, but the policy is local-only (private data)"}


def test_spec_limits_filter():
    s = spec(estimated_hours=10, limits={"max_usd": 30, "max_usd_per_hour": 2, "max_hours": 5})
    p = policy(primary="aws")
    rows = {r.offer.instance: r.verdict for r in plan(s, p, sets(
        offer("aws", 2_500_000, gpu="H100", instance="hourly"),
        offer("aws", 1_000_000, gpu="A100", instance="long"),
        offer("aws", 2_000_000, gpu="A40", instance="slow-and-long"),
        offer("aws", 1_900_000, gpu="H100", instance="ok"),
    )).rows}
    assert rows == {"hourly": "over the $2.00/hour cap", "long": "expected runtime over the job's max_hours (5 h)",
                    "slow-and-long": "expected runtime over the job's max_hours (5 h)", "ok": "chosen"}
    over = plan(spec(estimated_hours=10, limits={"max_usd": 5}), p, sets(offer("aws", 1_000_000)))
    assert over.chosen is None and over.rows[0].verdict == "expected cost over the job's max_usd ($5.00)"
    assert "1 offer: expected cost over the job's max_usd ($5.00)" in over.explain_failure()


def test_failure_rates_most_specific_wins():
    s = spec(estimated_hours=1)
    p = policy(primary="aws")
    spot = offer("aws", 1_000_000, spot=True, instance="s")
    rates = {"aws": 0.5, "aws:spot": 0.2, spot.key: 0.1}
    assert plan(s, p, sets(spot), failure_rates=rates).rows[0].risk_micro_usd == 100_000
    assert plan(s, p, sets(spot), failure_rates={"aws": 0.5, "aws:spot": 0.2}).rows[0].risk_micro_usd == 200_000
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        plan(s, p, sets(spot), failure_rates={"aws": 1.5})


def test_backend_reasons_and_render():
    result = plan(spec(estimated_hours=2), policy(primary="aws", fallbacks=["gcp"]), [
        OfferSet(backend="aws", offers=[offer("aws", 2_000_000, instance="p4d", detail={"price_source": "catalog",
                                                                                    "catalog_date": "2025-07-01"})]),
        OfferSet(backend="gcp", reasons=["no answer within 10 s"]),
    ] + sets(*[offer("aws", 3_000_000 + i, instance=f"x{i}") for i in range(20)]))
    console = Console(width=220, record=True)
    render_plan(result, limit=5).print(console)
    text = console.export_text()
    assert "✔ the chosen offer" in text and "p4d" in text and "$2.00*" in text
    assert "catalog list price (dated 2025-07-01), not a live quote" in text
    assert "16 more offers: 16 costlier than the chosen offer" in text
    assert result.reasons == {"gcp": ["no answer within 10 s"]}
    assert result.as_dict()["chosen"] == "aws/us-east-1/p4d/on-demand"


class Slow(Backend):
    name, trusted = "slow", True

    async def offers(self, request):
        await asyncio.sleep(5)

    submit = status = logs = cancel = fetch = cost = None


class Broken(Slow):
    async def offers(self, request):
        raise RuntimeError("boom")


class Quick(Slow):
    async def offers(self, request):
        return OfferSet(backend="quick", offers=[offer("aws")])


Slow.__abstractmethods__ = frozenset()


def test_gather_offers_times_out_and_survives_broken_backends():
    found = asyncio.run(gather_offers(OfferRequest(spec=spec()), {"slow": Slow(), "broken": Broken(), "quick": Quick()},
                                     valid_s=60, rate_max_age_s=60, timeout_s=0.2))
    by = {s.backend: s for s in found}
    assert by["slow"].reasons == ["no answer within 0.2 s"]
    assert by["broken"].reasons == ["error while listing offers: boom"]
    assert len(by["quick"].offers) == 1
