"""The planner: gathers offers from the backends a policy allows, filters them, and picks one.

For each offer it estimates the runtime (reference A100-hours from the spec's `estimated_hours`,
else the job's own history by name (broker/planning/estimate.py: by its steps when known), else the history
of the workload class, else 1 hour, scaled by the offer's relative GPU
throughput; with neither estimate nor history, the job's max_hours bounds it), then the expected
cost, every part rounded up to the micro-dollar:

    compute      = price/hour × hours × nodes
    transfer     = egress of remote input data from the cloud that holds it
    verification = compute × (q+2)·k/T        for offers the replay audit covers
    risk         = compute × the backend's observed failure/preemption rate

Offers that break a constraint (the class's, the policy's or the spec's limits) are filtered
with the reason. Among the rest, the first tier of the class's chain that has any is used, and
the objective picks within it. Every offer ends in the plan's rows with what happened to it
(chosen, or why it lost), so `trainmaster offers` and `submit --dry-run` explain the choice.

Planning is linear in the offers (targets: 10,000 in ≤ 20 ms, 100,000 in ≤ 200 ms; measured by
tests/benchmarks/bench_planner.py): the hot loop reads each offer's fields from its `__dict__` and
everything else from per-backend locals and per-plan caches, and the cyclic garbage collector is
paused while the plan's rows are built (see `plan`).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import islice
from math import gcd
from operator import itemgetter
from typing import NamedTuple

from trainmaster.backends.base import Backend, Offer, OfferRequest, OfferSet, Quoting
from trainmaster.backends.catalog.gpus import REFERENCE, canonical_gpu, gpu_matches, throughput
from trainmaster.backends.catalog.transfer import egress_micro_usd, source_cloud
from trainmaster.broker.planning.gating import gate
from trainmaster.broker.planning.policy import ClassPolicy, Policy, tier_name
from trainmaster.jobs.money import display_usd
from trainmaster.jobs.spec import JobSpec
from trainmaster.jobs.yamlfile import FileError

OFFER_TIMEOUT_S = 10.0
DEFAULT_HOURS = 1.0
ASSUMED_SEGMENTS = 400
"""n = T/k when the job's total steps are unknown (docs/protocol.md §9: k = 25, T = 10,000)."""
PPM = 1_000_000
CHOSEN = "chosen"


class Considered(NamedTuple):
    """One offer as the planner saw it (a named tuple: 100,000 of these must be cheap to build)."""

    offer: Offer
    hours: float
    expected_micro_usd: int
    verdict: str  # "chosen" or why it lost
    tier: int | None = None  # index in the class's chain (0: primary); None when the offer is in no tier
    compute_micro_usd: int = 0
    transfer_micro_usd: int = 0
    verification_micro_usd: int = 0
    risk_micro_usd: int = 0
    finish_s: int = 0  # expected start delay + runtime


@dataclass
class Plan:
    rows: list[Considered] = field(default_factory=list)
    reasons: dict[str, list[str]] = field(default_factory=dict)  # backend -> why it offered nothing
    workload: str = ""
    objective: str = "cheapest"
    tiers: list[str] = field(default_factory=list)  # the chain as written, one entry per tier
    basis: str = ""  # where the runtime estimate came from
    notes: list[str] = field(default_factory=list)
    ranked: int = 0  # rows[:ranked] could be chosen (the chosen one and those that lost to it); the rest were filtered
    quotes: dict[str, Quoting] = field(default_factory=dict)  # backend -> the broker's record of its answer
    partner: Considered | None = None  # the refereed tier's second miner (broker/planning/referee_pair.py)

    def quoted(self, offer: Offer) -> Offer:
        """`offer` with its validity and quote evidence, as its backend's answer in this plan was received."""
        quoting = self.quotes.get(offer.backend)
        return quoting.stamp(offer) if quoting is not None else offer

    @property
    def chosen(self) -> Considered | None:
        first = self.rows[0] if self.rows else None
        return first if first is not None and first.verdict == CHOSEN else None

    def explain_failure(self) -> str:
        lines = [f"no offer can run this {self.workload or 'job'} (chain: {' → '.join(self.tiers) or 'none'}):"]
        lines += [f"  {name}: {'; '.join(why)}" for name, why in self.reasons.items()]
        for verdict, count in Counter(r.verdict for r in self.rows).most_common():
            lines.append(f"  {count} offer{'s' if count > 1 else ''}: {verdict}")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {
            "workload": self.workload, "objective": self.objective, "tiers": self.tiers, "basis": self.basis,
            "notes": self.notes, "unavailable": self.reasons,
            "quotes": {name: q.model_dump(mode="json") for name, q in self.quotes.items()},
            "chosen": self.chosen.offer.key if self.chosen else None,
            "partner": self.partner.offer.key if self.partner else None,
            "considered": [
                {"offer": r.offer.model_dump(mode="json"), "key": r.offer.key, "tier": r.tier, "hours": r.hours,
                 "expected_micro_usd": r.expected_micro_usd, "compute_micro_usd": r.compute_micro_usd,
                 "transfer_micro_usd": r.transfer_micro_usd, "verification_micro_usd": r.verification_micro_usd,
                 "risk_micro_usd": r.risk_micro_usd, "finish_s": r.finish_s, "verdict": r.verdict}
                for r in self.rows
            ],
        }


class PlanError(RuntimeError):
    def __init__(self, plan: Plan):
        self.plan = plan
        super().__init__(plan.explain_failure())


async def gather_offers(
    request: OfferRequest, backends: dict[str, Backend], *, valid_s: float, rate_max_age_s: float,
    timeout_s: float = OFFER_TIMEOUT_S,
) -> list[OfferSet]:
    """Ask every backend at once; one that is slow or broken, or lacks a feature the job needs
    (`broker.gating`, checked before it is asked), gives reasons instead of offers.

    Each offer is stamped with the backend that was asked, that backend's trust from the registry, how
    long its price holds and the evidence of the quote: what a backend (or an executor behind it) writes
    into those fields is never believed beyond what `stamped` keeps."""

    async def one(name: str, backend: Backend) -> OfferSet:
        reasons = gate(backend, request)
        if reasons:
            return OfferSet(backend=name, reasons=reasons)
        try:
            found = await asyncio.wait_for(backend.offers(request), timeout_s)
        except asyncio.TimeoutError:
            return OfferSet(backend=name, reasons=[f"no answer within {timeout_s:g} s"])
        except FileError:
            raise  # the user's own file (a catalog override) is broken: said with its file and line, never skipped
        except Exception as exc:  # a broken backend must not stop the others from offering
            return OfferSet(backend=name, reasons=[f"error while listing offers: {exc}"])
        now = time.time()
        rate = request.rate.evidence(rate_max_age_s, now) if request.rate else {}
        return stamped(name, found, Quoting(by=name, at=now, valid_until=now + valid_s, rate=rate))

    return list(await asyncio.gather(*(one(n, b) for n, b in backends.items())))


def stamped(name: str, found: OfferSet, quoting: Quoting) -> OfferSet:
    """`found` as the answer of backend `name`: every offer names it and carries its registered trust, and
    the answer carries the broker's record of the quote, stamped on the offer that is chosen
    (`Plan.quoted`): copying every offer of a large subnet for it would cost more than planning them."""
    from trainmaster.backends.registry import trusted

    trust = trusted(name)
    offers = [o if (o.backend, o.trusted) == (name, trust) else o.model_copy(update={"backend": name, "trusted": trust})
              for o in found.offers]
    return OfferSet(backend=name, offers=offers, reasons=found.reasons, quoting=quoting)


def hours_unit(spec: JobSpec) -> str:
    """What a runtime estimate is counted in: reference GPU-hours (they scale with each GPU's throughput) for a job
    on GPUs; plain hours for a CPU job, which no GPU's speed changes."""
    return f"{REFERENCE}-hours" if spec.resources.gpus else "hours"


def reference_hours(hours: float, gpu_type: str | None) -> float:
    """A runtime measured on `gpu_type`, in reference (A100) hours: what `history` holds."""
    return hours * (throughput(gpu_type) or 1.0)


def plan(
    spec: JobSpec,
    policy: Policy,
    offer_sets: list[OfferSet],
    *,
    blocked: frozenset[str] = frozenset(),
    banned: frozenset[str] = frozenset(),
    history: Mapping[str, float] | None = None,
    failure_rates: Mapping[str, float] | None = None,
    data_bytes: Mapping[str, int] | None = None,
    total_steps: int | None = None,
    now: datetime | None = None,
    own: tuple[float, str] | None = None,
) -> Plan:
    """Choose among offers by the policy of the spec's workload class.

    blocked: offer keys (or whole backend names) that failed before and must not be chosen again.
    banned: offer keys of banned executors (`trainmaster executors ls`), never chosen.
    history: workload class -> typical runtime in reference A100-hours (see `reference_hours`).
    failure_rates: observed failure/preemption rate in [0, 1) by offer key, `backend:spot`,
        `backend:on-demand` or backend (most specific wins).
    data_bytes: size of each of the spec's data sources, by name (unknown sizes are not priced).
    total_steps: T, the job's training steps, for the audit overhead (default n = 400 segments).
    own: the job's own estimate from the runs of its name (reference hours, where it came from), used
        when the spec gives no `estimated_hours`, before the class's history.
    """
    cls = policy.for_class(spec.workload)
    ctx = _Context(spec, policy, cls, blocked | banned, history or {}, failure_rates or {}, data_bytes or {}, total_steps,
                   now or datetime.now(timezone.utc), own, banned)
    result = Plan(
        reasons={s.backend: list(s.reasons) for s in offer_sets if s.reasons},
        quotes={s.backend: s.quoting for s in offer_sets if s.quoting is not None and s.offers},
        workload=getattr(spec.workload, "value", spec.workload), objective=cls.objective, tiers=[tier_name(t) for t in ctx.tiers], basis=ctx.basis, notes=ctx.notes,
    )
    # A plan allocates a row per offer (a tuple holding the Offer, so tracked by the cyclic GC) and
    # keeps them all. With the collector on, the young collections this sets off keep promoting rows,
    # and at 100,000 offers about one full collection per plan follows, walking the whole heap, the
    # offers included: 0.33 s of a 0.76 s plan on the benchmark machine, and the part that grew faster
    # than the offers (at 10,000 a plan stays under the full-collection threshold). Nothing here makes
    # reference cycles, so the collector is paused while the rows are built. Resumed as is, it would
    # first walk every new row in one young collection (~70 ms at 100,000) only to promote them all;
    # for a big plan, gc.freeze() + gc.unfreeze() instead moves every tracked object into the oldest
    # generation without walking any (documented behaviour, O(1)), which is where the rows would end
    # up; other young objects of the process go along, so a garbage cycle among them waits for the
    # next full collection. Not when someone else holds objects frozen (unfreeze would undo their
    # freeze), nor for small plans, where the walk is cheap. The collector is given back as it was,
    # also when planning raises.
    rows: list[Considered] = []
    collecting = gc.isenabled()
    gc.disable()
    try:
        by_tier: list[list[tuple]] = [[] for _ in ctx.tiers]  # the candidates, one list per tier of the chain
        filtered: list[Considered] = []
        for offer_set in offer_sets:
            ctx.evaluate(offer_set, by_tier, filtered)
        rows = _rank(ctx, by_tier)
        result.ranked = len(rows)
        rows += filtered
    finally:
        if collecting:
            if len(rows) >= 1_000 and not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()
    result.rows = rows
    result.notes += ctx.late_notes()
    return result


class _Context:
    """Everything about one planning that does not depend on the offer, computed once."""

    def __init__(self, spec, policy, cls: ClassPolicy, blocked, history, rates, data_bytes, total_steps, now, own,
                 banned=frozenset()):
        self.spec, self.policy, self.cls, self.blocked, self.rates = spec, policy, cls, blocked, rates
        self.tiers = cls.tiers
        self.notes: list[str] = []
        con, res, limits = cls.constraints, spec.resources, spec.limits
        self.local_only = policy.local_only or con.local_only
        self.allowed = set(con.allowed_backends) if con.allowed_backends is not None else None
        self.gpu_types = list(con.gpu_types or ())
        self.spot_allowed = con.spot_allowed
        self.check_regions = con.regions is not None
        caps = [c for c in (con.max_usd_per_hour, limits.max_usd_per_hour) if c is not None]
        self.hourly_cap = min(caps) if caps else None
        self.max_hours, self.max_usd = limits.max_hours, limits.max_usd
        self.deadline_s = self._deadline(cls, limits.deadline, now)
        self.need_gpus, self.need_vram_mb = res.gpus, (res.min_vram_gb or 0) * 1000
        self.need_cpus, self.need_memory_mb, self.need_nodes = res.cpus, (res.memory_gb or 0) * 1024, res.nodes
        hours, self.basis, self.scaled = self._base_hours(history, own)
        self.base_s = hours * 3600
        self.audit = spec.verification.replay_audit
        self.audit_num, self.audit_den = self._audit_fraction(total_steps)
        self.keyed_rates = any("/" in k for k in rates)
        self.remote = [(d.name, source_cloud(d.source)) for d in spec.data if d.is_remote]
        self.data_bytes = data_bytes
        if any(name not in data_bytes for name, _ in self.remote):
            self.notes.append("transfer: sizes of some remote data sources are unknown, so their egress is not priced")
        # per-plan caches, filled as offers come (plain dicts: the hot loop's lookups specialise on them)
        self._regions: dict[str, str | None] = {}
        self._gpus: dict[str | None, tuple] = {}
        self._unknown_gpus: set[str] = set()
        # reason strings, built once
        self.r_blocked = "blocked after a failed attempt"
        self.r_banned = "its executor is banned (trainmaster executors ls)"
        self.banned = banned
        self.r_local = "leaves this machine, but the policy is local-only (private data)"
        self.r_not_allowed = f"backend not in allowed_backends ({', '.join(sorted(self.allowed or ()))})"
        self.r_spot = "spot capacity is not allowed by the policy"
        self.r_cap = f"over the {display_usd(self.hourly_cap or 0)}/hour cap"
        self.r_hours = f"expected runtime over the job's max_hours ({self.max_hours:g} h)" if self.max_hours else ""
        self.r_usd = f"expected cost over the job's max_usd ({display_usd(self.max_usd or 0)})"
        self.r_deadline = "expected to finish after the deadline"
        self.r_gpus = f"fewer than the {self.need_gpus} GPU(s) the job needs"
        self.r_vram = f"less than {res.min_vram_gb} GB per GPU"
        self.r_cpus = f"fewer than the {self.need_cpus} CPUs the job needs"
        self.r_memory = f"less than the {res.memory_gb} GB of memory the job needs"
        self.r_nodes = f"fewer than the {self.need_nodes} nodes the job needs"

    # per-plan set-up

    def _deadline(self, cls: ClassPolicy, deadline: datetime | None, now: datetime) -> float | None:
        """Seconds from now by which a run must finish, or None."""
        if deadline is not None:
            if deadline.tzinfo is None:
                deadline = deadline.replace(tzinfo=timezone.utc)
            return (deadline - now).total_seconds()
        if cls.objective == "cheapest-by-deadline":
            if cls.deadline_hours is not None:
                return cls.deadline_hours * 3600
            self.notes.append("cheapest-by-deadline without a deadline (limits.deadline or the class's "
                              "deadline_hours): planned as cheapest")
        return None

    def _base_hours(self, history: Mapping[str, float], own: tuple[float, str] | None) -> tuple[float, str, bool]:
        """Hours for the run, where the figure came from, and whether GPU throughput scales it.

        An estimate or history is in reference (A100) hours and scales; without one, the job's
        max_hours is the wall-clock bound it is cancelled at, so the run costs at most that anywhere.
        """
        spec = self.spec
        if spec.estimated_hours is not None:
            return spec.estimated_hours, f"estimated_hours {spec.estimated_hours:g} ({hours_unit(spec)})", True
        if own is not None:
            return own[0], own[1], True
        if spec.workload in history:
            hours = history[spec.workload]
            return hours, f"history of {spec.workload}: {hours:g} {hours_unit(spec)}", True
        if spec.limits.max_hours is not None:
            return spec.limits.max_hours, f"no estimate: the job's max_hours {spec.limits.max_hours:g} (upper bound)", False
        return DEFAULT_HOURS, f"no estimate: {DEFAULT_HOURS:g} {hours_unit(spec).removesuffix('s')} assumed", True

    def _audit_fraction(self, total_steps: int | None) -> tuple[int, int]:
        """(q+2)·k/T as a fraction, at most 1 (an audit never re-runs more than the whole job)."""
        q, k = self.spec.verification.challenge_segments, self.spec.checkpoint.segment_steps
        num, den = (q + 2) * k, (total_steps if total_steps else ASSUMED_SEGMENTS * k)
        return min(num, den), den

    def late_notes(self) -> list[str]:
        return [f"GPU {g} is not in the throughput table; runtime assumed as on an {REFERENCE}"
                for g in sorted(self._unknown_gpus)]

    # per backend

    def _tier_of(self, backend: str, spot: bool) -> int | None:
        for i, tier in enumerate(self.tiers):
            if any(s.backend == backend and s.admits_spot(spot) for s in tier):
                return i
        return None

    def _backend_reason(self, backend: str) -> str | None:
        if backend in self.blocked:
            return self.r_blocked
        if self.local_only and backend != "local":
            return self.r_local
        if self.allowed is not None and backend not in self.allowed:
            return self.r_not_allowed
        return None

    def _tier_reason(self, backend: str, spot: bool) -> str:
        names = [str(s) for tier in self.tiers for s in tier if s.backend == backend]
        if names:
            return f"the chain takes only {', '.join(names)} from {backend}, not {'spot' if spot else 'on-demand'}"
        return f"{backend} is not in this class's chain ({' → '.join(tier_name(t) for t in self.tiers)})"

    def _rate_ppm(self, backend: str, spot: bool) -> int:
        rates = self.rates
        rate = rates.get(f"{backend}:{'spot' if spot else 'on-demand'}", rates.get(backend, 0.0))
        return _ppm(rate)

    def _transfer(self, backend: str) -> int:
        return sum(egress_micro_usd(cloud, backend, self.data_bytes.get(name, 0)) for name, cloud in self.remote)

    # per region and GPU type (cached)

    def _region_reason(self, region: str) -> str | None:
        """Why a region is refused (None when allowed); cached in `_regions`."""
        constraints = self.cls.constraints
        if constraints.region_allowed(region):
            return None
        return f"region {region} is not among the allowed {', '.join(constraints.regions or ())}"

    def _gpu(self, gpu_type: str | None) -> tuple[str | None, int, float, int, int, int]:
        """(reason the GPU type is refused or None, runtime in seconds on it, the same in hours, and
        a, b - 1, b with a/b = seconds/3600 in lowest terms, for the compute cost); cached in `_gpus`."""
        wanted = self.spec.resources.gpu_types
        reason = None
        if self.need_gpus and not gpu_matches(gpu_type, self.gpu_types):
            reason = f"GPU {gpu_type or 'none'} is not among the policy's {'/'.join(self.gpu_types)}"
        elif self.need_gpus and not gpu_matches(gpu_type, wanted):
            reason = f"GPU {gpu_type or 'none'} is not among the job's {'/'.join(wanted)}"
        speed = 1.0
        if self.scaled and self.need_gpus and gpu_type is not None:
            speed = throughput(gpu_type) or 1.0
            if throughput(gpu_type) is None:
                self._unknown_gpus.add(canonical_gpu(gpu_type))
        seconds = -int(-self.base_s // speed)
        a, b = _reduced(seconds, 3600)
        return reason, seconds, seconds / 3600, a, b - 1, b

    # The fields the hot loop reads for every offer, in one C call on the offer's __dict__: pydantic's
    # BaseModel defines __getattr__, which keeps CPython from specialising attribute loads on Offer,
    # so nine attribute reads cost about twice this. (gpu_memory_mb and memory_mb are read only
    # when the job sets a minimum.)
    _fields = itemgetter("spot", "region", "gpu_count", "cpus", "nodes", "gpu_type", "price_per_hour_micro_usd",
                         "trusted", "expected_start_s", "job_price_micro_usd")

    def evaluate(self, offer_set: OfferSet, by_tier: list[list[tuple]], filtered: list[Considered]) -> None:
        """Each offer of one backend becomes a candidate of its tier, appended to `by_tier[tier]` as
        (sort key, sort key, sequence number, row parts), or a finished row appended to `filtered`.

        This loop is the planner's cost: it runs once per offer, 100,000 times for a large subnet,
        so everything that does not depend on the offer is looked up once per backend here or once
        per region and GPU type in the plan's caches, and the loop body is kept to plain locals.
        """
        if not offer_set.offers:
            return
        backend = offer_set.backend
        refused = self._backend_reason(backend)
        transfer = self._transfer(backend)
        # Each cost part is a ceiling of x·p/q, computed as (x·p' + q' - 1) // q' with p'/q' = p/q in
        # lowest terms: exact, and on smaller integers than x·p (10 % is 1/10, not 100,000/1,000,000).
        by_spot = []  # on-demand, spot: (reason the backend refuses it or None, tier, risk p', q' - 1, q', append)
        for spot in (False, True):
            tier = self._tier_of(backend, spot)
            reason = refused or (None if tier is not None else self._tier_reason(backend, spot))
            rate_n, rate_d = _reduced(self._rate_ppm(backend, spot), PPM)
            by_spot.append((reason, tier, rate_n, rate_d - 1, rate_d, by_tier[tier].append if tier is not None else None))
        on_demand, spot_capacity = by_spot
        audit_n, audit_d = _reduced(self.audit_num, self.audit_den)
        audit_d1 = audit_d - 1
        # the audit's p' for a trusted and for an untrusted offer (0: not audited)
        audit_trusted = audit_n if self.audit == "always" else 0
        audit_untrusted = audit_n if self.audit in ("always", "auto") else 0
        rates, blocked, keyed_rates = self.rates, self.blocked, self.keyed_rates
        any_blocked = bool(blocked)
        # without an estimate the runtime *is* max_hours (an upper bound), which it cannot exceed
        cap, max_hours_s = self.hourly_cap, (self.max_hours * 3600 if self.max_hours and self.scaled else None)
        max_usd, deadline_s = self.max_usd, self.deadline_s
        any_limit = cap is not None or max_hours_s is not None or max_usd is not None or deadline_s is not None
        no_spot, check_regions, regions, gpus = not self.spot_allowed, self.check_regions, self._regions, self._gpus
        need_gpus, need_vram, need_cpus = self.need_gpus, self.need_vram_mb, self.need_cpus
        need_memory, need_nodes = self.need_memory_mb, self.need_nodes
        check_vram, check_memory = bool(need_vram), bool(need_memory)
        objective_fast = self.cls.objective == "fastest"
        append_filtered, new_row, fields = filtered.append, tuple.__new__, self._fields
        seq = sum(map(len, by_tier))  # unique and increasing within a tier: ties keep the offers' order
        for offer in offer_set.offers:
            spot, region, gpu_count, cpus, nodes, gpu_type, price, trusted, start, fixed = fields(offer.__dict__)
            reason, tier, rate_n, rate_d1, rate_d, append = spot_capacity if spot else on_demand
            try:  # a miss (once per GPU type, and per region, in a plan) fills the cache
                gpu_reason, seconds, hours, a, b1, b = gpus[gpu_type]
            except KeyError:
                gpu_reason, seconds, hours, a, b1, b = gpus[gpu_type] = self._gpu(gpu_type)
            try:
                region_reason = regions[region]
            except KeyError:
                region_reason = regions[region] = self._region_reason(region) if check_regions else None
            if reason is None:  # the offer's own fit, cheapest checks first
                if any_blocked and offer.key in blocked:
                    reason = self.r_banned if offer.key in self.banned else self.r_blocked
                elif spot and no_spot:
                    reason = self.r_spot
                elif region_reason is not None:
                    reason = region_reason
                elif gpu_count < need_gpus:
                    reason = self.r_gpus
                elif check_vram and (offer.gpu_memory_mb or 0) < need_vram:
                    reason = self.r_vram
                elif cpus < need_cpus:
                    reason = self.r_cpus
                elif check_memory and (offer.memory_mb or 0) < need_memory:
                    reason = self.r_memory
                elif nodes < need_nodes:
                    reason = self.r_nodes
                else:
                    reason = gpu_reason
            # the expected cost (every row shows it, so filtered offers are costed too); zero parts
            # are skipped, not added: each integer operation allocates
            hourly = price if nodes == 1 else price * nodes
            if fixed is None:
                compute = hourly * a if b == 1 else (hourly * a + b1) // b  # ⌈hourly × seconds / 3600⌉
            else:  # a quoted price for the job's whole work
                compute = fixed
            total = compute + transfer
            audit = audit_trusted if trusted else audit_untrusted
            if audit:
                verification = (compute * audit + audit_d1) // audit_d  # ⌈compute × (q+2)·k/T⌉
                total += verification
            else:
                verification = 0
            if keyed_rates and offer.key in rates:
                rate_n, rate_d = _reduced(_ppm(rates[offer.key]), PPM)
                rate_d1 = rate_d - 1
            if rate_n:
                risk = (compute * rate_n + rate_d1) // rate_d  # ⌈compute × failure rate⌉
                total += risk
            else:
                risk = 0
            finish = start + seconds
            if reason is None and any_limit:
                if cap is not None and hourly > cap:
                    reason = self.r_cap
                elif max_hours_s is not None and seconds > max_hours_s:
                    reason = self.r_hours
                elif max_usd is not None and total > max_usd:
                    reason = self.r_usd
                elif deadline_s is not None and finish > deadline_s:
                    reason = self.r_deadline
            if reason is None:
                seq += 1
                if objective_fast:
                    append((finish, total, seq, offer, hours, total, compute, transfer, verification, risk, finish))
                else:
                    append((total, finish, seq, offer, hours, total, compute, transfer, verification, risk, finish))
            else:
                append_filtered(new_row(Considered, (offer, hours, total, reason, tier, compute, transfer,
                                                     verification, risk, finish)))


def _ppm(rate: float) -> int:
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"a failure rate must be in [0, 1), got {rate!r}")
    return round(rate * PPM)


def _reduced(p: int, q: int) -> tuple[int, int]:
    """p/q in lowest terms (q > 0): the same ceilings, on smaller integers."""
    g = gcd(p, q)
    return p // g, q // g


def _rank(ctx: _Context, by_tier: list[list[tuple]]) -> list[Considered]:
    """Candidates best first: the chosen one, then why each other lost against it.

    Tier by tier (the lists are already in the chain's order), each sorted on its own by the
    objective's key: (cost, finish) or (finish, cost), then the sequence number, so ties keep the
    offers' order and the comparison never reaches the offer. Flat tuples of ints compare in C;
    a key function, or nested key tuples, cost several times as much per comparison.
    """
    fast = ctx.cls.objective == "fastest"
    rows: list[Considered] = []
    append, new_row = rows.append, tuple.__new__
    best_tier = None
    for tier, candidates in enumerate(by_tier):
        if not candidates:
            continue
        candidates.sort()
        if best_tier is None:
            best_tier = tier
            first = candidates[0]
            best0, best1 = first[0], first[1]
            worse = "finishes later than the chosen offer" if fast else "costlier than the chosen offer"
            later = "costlier at the same finish time" if fast else "same cost, finishes later"
            tie = "tie: the chosen offer came first"
            _, _, _, offer, hours, total, compute, transfer, verification, risk, finish = first
            append(new_row(Considered, (offer, hours, total, CHOSEN, tier, compute, transfer, verification, risk,
                                        finish)))
            for k0, k1, _, offer, hours, total, compute, transfer, verification, risk, finish in islice(candidates, 1, None):
                verdict = worse if k0 != best0 else later if k1 != best1 else tie
                append(new_row(Considered, (offer, hours, total, verdict, tier, compute, transfer, verification, risk,
                                            finish)))
        else:
            verdict = (f"fallback {tier_name(ctx.tiers[tier])} is not needed while "
                       f"{tier_name(ctx.tiers[best_tier])} has an offer")
            for _, _, _, offer, hours, total, compute, transfer, verification, risk, finish in candidates:
                append(new_row(Considered, (offer, hours, total, verdict, tier, compute, transfer, verification, risk,
                                            finish)))
    return rows
