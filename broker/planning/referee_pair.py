"""The refereed tier's pair: two miners of different coldkeys, drawn at random, for one job (docs/protocol.md §3c).

After the planner has ranked the offers (broker/planning/planner.py), a job whose tier is `refereed` and whose
chosen offer is untrusted compute gets two offers instead of one: drawn uniformly at random (`secrets`, so no
miner can predict or price its way into being paired with an accomplice) among the candidates of the chosen
tier — the offers of the chosen offer's backend that passed every filter, with the chosen offer's GPU type and
count (the same hardware, so that deterministic runs reach the same bits), and a known coldkey — the second of
a different coldkey than the first. Neither is told of the other. Each is paid its own price, so the pair's
expected cost is the sum: about twice a single run, which the plan's note says. When the pair would cost more
than the job's `limits.max_usd`, the two cheapest candidates of different coldkeys are taken instead; when no
two candidates are left, nothing is chosen, with the reason.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from trainmaster.backends.base import Offer
from trainmaster.broker.planning.planner import CHOSEN, Considered, Plan
from trainmaster.jobs.money import display_usd
from trainmaster.jobs.spec import JobSpec

PARTNER = "chosen: the refereed tier's second miner"
NOT_DRAWN = "not drawn for the refereed pair"


def coldkey(offer: Offer) -> str | None:
    """The offer's owner as its backend's directory names it (a miner's coldkey); None when unknown."""
    found = offer.detail.get("coldkey")
    return found if isinstance(found, str) and found else None


def pair_up(result: Plan, spec: JobSpec, *, draw: Callable[[int], int] = secrets.randbelow) -> None:
    """Turn the plan's choice into a refereed pair (in place): `result.rows[0]` the first miner, `result.partner`
    the second, a note saying what the pair costs; or no choice, with why. `draw(n)`: a uniform integer below n."""
    chosen = result.chosen
    if chosen is None:
        return
    if not chosen.offer.trusted and (refusal := _not_refereeable(spec)):
        _refuse(result, refusal)
        return
    if chosen.offer.trusted:
        result.notes.append(f"verification tier refereed: the chosen offer runs on {chosen.offer.backend}, compute we "
                            "control, which is not refereed (one run, its own checks)")
        return
    group = (chosen.offer.backend, chosen.offer.gpu_type, chosen.offer.gpu_count)
    ranked = result.rows[:result.ranked]
    candidates = [r for r in ranked if r.tier == chosen.tier and not r.offer.trusted
                  and (r.offer.backend, r.offer.gpu_type, r.offer.gpu_count) == group and coldkey(r.offer)]
    owners = {coldkey(r.offer) for r in candidates}
    hardware = f"{chosen.offer.gpu_count}× {chosen.offer.gpu_type}" if chosen.offer.gpu_count else "CPU"
    if len(owners) < 2:
        _refuse(result, f"the refereed tier needs two miners of different coldkeys offering {hardware} on "
                        f"{chosen.offer.backend}; {len(candidates)} offer(s) of {len(owners)} coldkey(s) qualify")
        return
    first = candidates[draw(len(candidates))]
    others = [r for r in candidates if coldkey(r.offer) != coldkey(first.offer)]
    second = others[draw(len(others))]
    limit = spec.limits.max_usd
    how = f"drawn at random among {len(candidates)} offers of {hardware}"
    if limit is not None and first.expected_micro_usd + second.expected_micro_usd > limit:
        first, second = _cheapest_pair(candidates)
        how = f"the cheapest two of {len(candidates)} offers of {hardware} (a random pair would pass max_usd)"
        if first.expected_micro_usd + second.expected_micro_usd > limit:
            _refuse(result, f"the refereed pair costs {display_usd(first.expected_micro_usd + second.expected_micro_usd)}"
                            f" at least, over the job's max_usd ({display_usd(limit)})")
            return
    _mark(result, first, second, how)


def _not_refereeable(spec: JobSpec) -> str | None:
    """Why two runs of the job cannot be refereed (None when they can): the referee replays one segment of a
    shipped runtime recipe, bit for bit."""
    from trainmaster.verify.recipe_run import runs_runtime_recipe

    if spec.bundle_recipe is not None:
        return ("the refereed tier replays shipped runtime recipes in this version, not the job's own recipe "
                f"({spec.recipe}): choose verification.tier sampled")
    if not runs_runtime_recipe(spec):
        return "the refereed tier compares the two runs' commitments: the job must train through a runtime recipe"
    return None


def _cheapest_pair(candidates: list[Considered]) -> tuple[Considered, Considered]:
    by_cost = sorted(candidates, key=lambda r: r.expected_micro_usd)
    first = by_cost[0]
    return first, next(r for r in by_cost if coldkey(r.offer) != coldkey(first.offer))


def _mark(result: Plan, first: Considered, second: Considered, how: str) -> None:
    """The pair at the top of the rows (first chosen, second its partner); the other ranked offers of the pair's
    tier and backend say they were not drawn; the rest keep their verdicts."""
    ranked = result.rows[:result.ranked]
    rest = [r._replace(verdict=f"{NOT_DRAWN} ({how})")
            if r.tier == first.tier and r.offer.backend == first.offer.backend else r
            for r in ranked if r is not first and r is not second]
    result.rows = [first._replace(verdict=CHOSEN), second._replace(verdict=PARTNER), *rest,
                   *result.rows[result.ranked:]]
    result.partner = result.rows[1]
    total = first.expected_micro_usd + second.expected_micro_usd
    result.notes.append(
        f"verification tier refereed: two miners of different coldkeys run the job, neither told of the other "
        f"({how}); equal roots pay both, a dispute is settled by bisection and one replayed segment. Expected cost "
        f"{display_usd(first.expected_micro_usd)} + {display_usd(second.expected_micro_usd)} = {display_usd(total)}, "
        f"about 2× a single run")


def _refuse(result: Plan, reason: str) -> None:
    """No choice: every ranked row says why (the plan fails with it)."""
    result.rows = [r._replace(verdict=reason) if i < result.ranked else r for i, r in enumerate(result.rows)]
    result.reasons.setdefault("refereed tier", []).append(reason)
