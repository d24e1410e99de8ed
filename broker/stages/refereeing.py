"""The refereed tier at the broker (docs/protocol.md §3c): a pair's partner watched, and the ruling on the pair.

A job whose tier is `refereed` is dispatched on two miners of different coldkeys (broker/planning/referee_pair.py,
broker/stages/dispatch.py), the same seed for both and nothing in either request naming the other. The pair's
lead moves the job (broker/pairs.py); its partner is watched here (`watch_partner`) and waits `returned` once its
run ended. When the lead has returned and is being verified, `judge` rules on the pair, once both runs ended:

1. each signed commitment is fetched and checked (signature, job, bundle, k, n) and stored; a miner that sends
   none, or a bad one, forfeits;
2. equal roots: both **agreed** — the lead's outputs get every check but the replay audit (the two runs prove
   each other), and the partner is accepted and paid with the lead;
3. different roots: the trees are bisected to the first leaf j where they differ (verify/referee.py; one leaf
   opened per side per step, each tied to its root), then the agreed state before it is opened in full by one
   of them and one segment is replayed in the audit pool (verify/referee_replay.py). Of the sides whose
   commitment names the environment the replay ran in, the one whose leaf is not the replay's bits is
   **refuted** (rejected, unpaid, banned), the other **upheld** (its outputs get the remaining checks); a side
   naming another environment is not judged: **released** (unpaid, unbanned) when the other was upheld, else
   audited alone. A miner that does not answer a step (a refusal, garbage, a proof that does not reach its
   root, silence past the policy's `challenge_deadline_s`) **forfeits**: rejected, unpaid, banned, and the
   other is audited **alone** by the sampled tier. The replay refutes both: neither is paid;
4. a partner that ended without committing (it failed, was lost) leaves the lead audited alone;
5. when no side names the replay's environment (this verifier is not the miners' GPU type or software) or the
   replay cannot run here (the job's own recipe), the ruling is **undecided**: the lead is `unverified`
   (nothing paid or banned) until `trainmaster verify JOB --again` runs it where it can.

Every step is a `referee` event on the job (each bisection step with both openings, then the ruling), so a broker
killed anywhere resumes from the last step recorded: no opening asked twice after it was recorded, no ruling made
twice, nothing paid twice (each attempt's money moves once, on its own keys).
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmaster.backends.base import (
    BackendError, Handle, LocalEnvironmentError, Phase, TransientBackendError,
)
from trainmaster.backends.features import OpensLeaves, RunsUntrusted
from trainmaster.backends.retry import ATTEMPTS, retried
from trainmaster.broker import audit_pool, failures, pairs, paths, states
from trainmaster.broker.stages import dispatch
from trainmaster.broker.stages.job_context import JobContext
from trainmaster.broker.stages.ledger_moves import end_attempt
from trainmaster.broker.stages.reactions import asked_status, react
from trainmaster.broker.store import Attempt

EVENT = "referee"
"""The kind of the job events that record each bisection step (`step`), the ruling (`ruling`), and the lead waiting
for its partner (`waiting`)."""


@dataclass
class Judged:
    """What the ruling means for the lead's verification: its evidence (the verdict's `referee`), whether the lead
    is audited alone (the sampled tier's replay), or the lead's verdict when the ruling settles it."""

    evidence: dict[str, Any]
    replay: bool = False
    verdict: Any = None
    release: str | None = None
    """Why the lead is released (its partner upheld, its own bits not judgeable here): it ends failed, unpaid and
    unbanned, and the partner leads."""


class _Settled(Exception):
    """The ruling is made before the bisection ends (a forfeit, an undecided replay)."""

    def __init__(self, ruling: dict[str, Any]):
        super().__init__("settled")
        self.ruling = ruling


# the partner


async def watch_partner(ctx: JobContext, attempt: Attempt) -> None:
    """The pair's partner: asked for its status like any attempt, its moves never the job's; once its run ended it
    waits `returned` (nothing fetched) for the referee. What stops it ends it alone (broker/stages/reactions.py)."""
    if attempt.state == "returned":
        return
    handle = await dispatch.handle(ctx, attempt)
    attempt = ctx.store.attempt(attempt.id)
    if handle is None or attempt.state in states.ATTEMPT_ENDS:
        return
    if (st := await asked_status(ctx, attempt, handle)) is None:
        return
    if st.phase is Phase.running and attempt.state == "dispatched":
        ctx.store.move_attempt(attempt.id, "running", started_at=st.started_at)
    elif st.phase is Phase.succeeded:
        ctx.store.move_attempt(attempt.id, "returned", started_at=st.started_at, ended_at=st.ended_at,
                               detail={"waiting": "for the referee (the refereed tier)"})
    elif st.phase in (Phase.failed, Phase.cancelled):
        cause = failures.cause_of(st.phase is Phase.cancelled, st.cause, st.exit_code)
        await react(ctx, attempt, cause, st.reason or cause.value, started_at=st.started_at, ended_at=st.ended_at)


JOB_ORDER = ("dispatched", "running", "returned", "verifying")


def catch_up(ctx: JobContext, lead: Attempt) -> None:
    """A partner that became its pair's lead (the first attempt ended early) brings the job to where it is: the
    job moved only with the first one, so it may still be `dispatched` or `running`."""
    if lead.state not in JOB_ORDER:
        return
    job = ctx.store.job(ctx.id)
    if job.state not in JOB_ORDER:
        return
    for state in JOB_ORDER[JOB_ORDER.index(job.state) + 1: JOB_ORDER.index(lead.state) + 1]:
        ctx.store.move_job(ctx.id, state, detail={"lead": lead.id})


async def stop_partner(ctx: JobContext, attempt: Attempt, reason: str) -> None:
    """Stop and end the other attempt of `attempt`'s pair (the job is about to end): cancelled, unpaid."""
    other = pairs.other(ctx.store, attempt)
    if other is None or other.state in states.ATTEMPT_ENDS:
        return
    if other.handle_json and other.state in states.ACTIVE_ATTEMPT:
        try:
            await retried(ctx.backend(other.backend).cancel, Handle.model_validate_json(other.handle_json))
        except BackendError as exc:
            ctx.log("error", {"message": f"stopping the refereed partner {other.n}: {exc}"}, other.id)
    await end_attempt(ctx, other, "cancelled", job_target=None, reason=f"its pair stopped: {reason}")


# the ruling


async def judge(ctx: JobContext, lead: Attempt, backend, handle: Handle) -> Judged | None:
    """The ruling on the lead's pair (made once both runs ended, or read back), applied to the partner; what it
    means for the lead. None while the partner still runs: the lead waits, verifying."""
    partner = pairs.other(ctx.store, lead)
    ruling = stored_ruling(ctx, lead.referee_pair)
    if ruling is None:
        if partner is not None and partner.state not in states.ATTEMPT_ENDS and partner.state != "returned":
            if not any(e.kind == EVENT and (e.detail or {}).get("waiting") == partner.id
                       for e in ctx.store.events(ctx.id)):
                ctx.log(EVENT, {"pair": lead.referee_pair, "waiting": partner.id,
                                "message": f"waiting for attempt {partner.n}, its refereed partner, to finish"}, lead.id)
            return None
        ruling = await _rule(ctx, lead, partner)
        if ruling["outcome"] != "undecided":
            summary = "; ".join(f"attempt {who.rsplit('.', 1)[-1]} {finding}" for who, finding in ruling["findings"].items())
            ctx.log(EVENT, {"pair": lead.referee_pair, "ruling": ruling,
                            "message": f"ruling: {ruling['outcome']} ({summary})"}, lead.id)
    await _apply_to_others(ctx, lead, ruling)
    return await asyncio.to_thread(_for_lead, ctx, lead, ruling)


def stored_ruling(ctx: JobContext, pair: str | None) -> dict[str, Any] | None:
    found = [e.detail["ruling"] for e in ctx.store.events(ctx.id)
             if e.kind == EVENT and (e.detail or {}).get("pair") == pair and "ruling" in (e.detail or {})]
    return found[-1] if found else None


def _ruling(lead: Attempt, partner: Attempt | None, outcome: str, findings: dict[str, str],
            reasons: dict[str, str], **more: Any) -> dict[str, Any]:
    return {"tier": "refereed", "pair": [a.id for a in (lead, partner) if a is not None], "outcome": outcome,
            "findings": findings, "reasons": reasons, **more}


async def _rule(ctx: JobContext, lead: Attempt, partner: Attempt | None) -> dict[str, Any]:
    if partner is None or partner.state in states.ATTEMPT_ENDS:
        why = ("was never started" if partner is None else
               f"ended {partner.state} before the referee compared them ({partner.reason or 'no reason given'})")
        return _ruling(lead, partner, "alone", {lead.id: "alone"},
                       {lead.id: f"its refereed partner {why}: audited alone by the sampled tier"})
    sides = (lead, partner)
    committed, forfeits = {}, {}
    try:
        for side in sides:
            try:
                committed[side.id] = await _commitment(ctx, side, sides)
            except _Forfeit as exc:
                forfeits[side.id] = exc.reason
    except _Settled as settled:
        return settled.ruling
    if forfeits:
        return _forfeited(lead, partner, forfeits, {})
    ca, cb = committed[lead.id], committed[partner.id]
    roots = {lead.id: ca.root, partner.id: cb.root}
    environment = {lead.id: ca.deterministic, partner.id: cb.deterministic}
    if ca.root == cb.root:
        return _ruling(lead, partner, "agreed", {lead.id: "agreed", partner.id: "agreed"},
                       {a.id: "its root equals its partner's" for a in sides}, roots=roots, environment=environment)
    try:
        return await _bisect_and_replay(ctx, lead, partner, {lead.id: ca, partner.id: cb}, roots, environment)
    except _Settled as settled:
        return settled.ruling


class _Forfeit(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


async def _commitment(ctx: JobContext, side: Attempt, sides: tuple[Attempt, Attempt]):
    """The side's signed commitment, verified against the hotkey it was dispatched to and the spec, and stored."""
    from trainmaster.jobs.commitment import Commitment, CommitmentError
    from trainmaster.verify.errors import VerificationError

    backend = ctx.backend(side.backend)
    if not isinstance(backend, RunsUntrusted) or not side.handle_json:
        raise _Forfeit("it runs on no untrusted backend that signs a commitment")
    try:
        signed = await retried(backend.signed_commitment, Handle.model_validate_json(side.handle_json))
    except LocalEnvironmentError as exc:
        _undecided(*sides, {}, f"fetching attempt {side.n}'s commitment failed on our side: {exc}")
    except BackendError as exc:
        raise _Forfeit(f"it sent no signed commitment: {exc}") from None
    try:
        commitment = Commitment.from_json(signed.commitment.encode("ascii", "strict"))
    except (CommitmentError, UnicodeEncodeError) as exc:
        raise _Forfeit(f"its commitment: {exc}") from None
    try:
        await asyncio.to_thread(_store, ctx, side, commitment, signed.signature, sides)
    except VerificationError as exc:
        raise _Forfeit(exc.reason) from None
    return commitment


def _store(ctx: JobContext, side: Attempt, commitment, signature: str, sides) -> None:
    from trainmaster.verify.commitments import CommitmentStore

    k = ctx.spec.checkpoint.segment_steps
    store = CommitmentStore(ctx.store.path)
    try:
        store.store(commitment, attempt_id=side.id, signature=signature, hotkey=side.executor_hotkey or "",
                    expected_job_id=ctx.id, expected_bundle_sha256=ctx.job.bundle_sha256, expected_k=k,
                    expected_n=_expected_n(ctx, commitment), alongside=frozenset(a.id for a in sides))
    finally:
        store.close()


def _expected_n(ctx: JobContext, commitment) -> int:
    """n = T / k from the spec's recipe (a job whose T the spec does not fix: the commitment's own)."""
    from trainmaster.verify.recipe_run import NotReplayable, recipe_config

    try:
        return int(recipe_config(ctx.spec)["steps"]) // ctx.spec.checkpoint.segment_steps
    except (NotReplayable, KeyError, ValueError):
        return commitment.n


def _forfeited(lead: Attempt, partner: Attempt, forfeits: dict[str, str], more: dict[str, Any]) -> dict[str, Any]:
    """A ruling where `forfeits` did not answer: each rejected; a side that did is audited alone."""
    findings = {a.id: "forfeited" if a.id in forfeits else "alone" for a in (lead, partner)}
    reasons = {a.id: f"forfeited: {forfeits[a.id]}" if a.id in forfeits
               else "its partner forfeited: audited alone by the sampled tier" for a in (lead, partner)}
    return _ruling(lead, partner, "forfeited", findings, reasons, **more)


async def _bisect_and_replay(ctx: JobContext, lead: Attempt, partner: Attempt, commitments: dict, roots: dict,
                             environment: dict) -> dict[str, Any]:
    from trainmaster.verify.referee import Bisection, dispute, judge as findings_of

    sides = (lead, partner)
    n = commitments[lead.id].n
    bisection = Bisection(n + 1)
    meter = {"leaf_bytes": 0, "state_bytes": 0}
    more = {"roots": roots, "environment": environment, "bytes_downloaded": meter}
    _resume(ctx, lead, partner, bisection, roots, meter)
    while True:
        wanted = [bisection.probe()] if not bisection.done else bisection.needed()
        if not wanted:
            break
        opened = await _open_both(ctx, sides, wanted, roots, n + 1, meter,
                                  {**more, "bisection": {"steps": bisection.steps, "node": list(bisection.node)}})
        ctx.log(EVENT, {"pair": lead.referee_pair, "step": {"indices": wanted, "openings": {
            who: [o for o, _ in got] for who, got in opened.items()}},
            "message": f"bisection: both opened leaf {', '.join(map(str, wanted))}"}, lead.id)
        for i, index in enumerate(wanted):
            a, b = opened[lead.id][i][1], opened[partner.id][i][1]
            bisection.record(index, a, b)
    j = bisection.first_differing
    leaves = {lead.id: bisection.opened[j][0], partner.id: bisection.opened[j][1]}
    found = dispute(j, *leaves.values())
    evidence = {**more, "bisection": {"steps": bisection.steps, "first_differing_leaf": j,
                                      "leaves_opened_per_side": len(bisection.opened),
                                      "leaves": {who: leaf.as_dict() for who, leaf in leaves.items()}},
                "dispute": found.as_dict()}
    replayed = await _replay(ctx, lead, partner, found, commitments, evidence, meter)
    verifier = replayed.get("verifier")
    evidence["replay"] = replayed
    # bits are judged only where they were computed: a side whose commitment names the verifier's environment
    judged = {who: leaf for who, leaf in leaves.items() if environment[who] == verifier}
    if not judged:
        _undecided(lead, partner, evidence, f"the replay ran in {verifier!r}, not the miners' "
                                            f"{' / '.join(sorted({str(e) for e in environment.values()}))}: settling "
                                            "their dispute needs a bit-for-bit replay where they ran (run `trainmaster "
                                            "verify JOB --again` on such a verifier)")
    findings = findings_of(found.compared, replayed, judged)
    what = {"initial": "S_0 as the broker builds it", "state": f"S_{j} as segment {j - 1} replays from the agreed "
            f"S_{j - 1}", "trace": f"segment {j}'s decisions as it replays from the agreed S_{j}"}[found.compared]
    reasons = {who: (f"upheld: its leaf {j} is {what}, bit for bit" if finding == "upheld" else
                     f"refuted: its leaf {j} is not {what} (the replayed segment's bits differ)")
               for who, finding in findings.items()}
    upheld = "upheld" in findings.values()
    for who in leaves.keys() - judged.keys():  # it names another environment: its bits cannot be judged here
        findings[who] = "released" if upheld else "alone"
        reasons[who] = (f"its commitment names {environment[who]!r}, not {verifier!r} where the replay ran, so its "
                        "bits are not judged here; " + ("its partner's were upheld: released unpaid (not banned: "
                                                        "nothing proves a fault)" if upheld else
                                                        "its partner's were refuted: audited alone by the sampled "
                                                        "tier"))
    outcome = "refuted both" if set(findings.values()) == {"refuted"} else "decided"
    return _ruling(lead, partner, outcome, findings, reasons, **evidence)


def _resume(ctx: JobContext, lead: Attempt, partner: Attempt, bisection, roots: dict, meter: dict) -> None:
    """The steps a broker recorded before it was killed, fed again (their openings checked again)."""
    from trainmaster.verify.referee import check_opening

    for e in ctx.store.events(ctx.id):
        step = (e.detail or {}).get("step") if e.kind == EVENT and (e.detail or {}).get("pair") == lead.referee_pair \
            else None
        if not step:
            continue
        openings = step["openings"]
        for i, index in enumerate(step["indices"]):
            a = check_opening(roots[lead.id], bisection.size, index, openings[lead.id][i])
            b = check_opening(roots[partner.id], bisection.size, index, openings[partner.id][i])
            bisection.record(index, a, b)
        meter["leaf_bytes"] += sum(_size(o) for side in openings.values() for o in side)
        meter["resumed_steps"] = meter.get("resumed_steps", 0) + 1


def _size(opening: dict) -> int:
    import json

    return len(json.dumps(opening))


async def _open_both(ctx: JobContext, sides, indices: list[int], roots: dict, size: int, meter: dict,
                     evidence: dict) -> dict[str, list]:
    """Both sides' openings of `indices`, each checked against its root; a side that does not answer forfeits."""
    from trainmaster.verify.errors import VerificationError
    from trainmaster.verify.referee import Forfeit, check_opening

    async def one(side: Attempt) -> list:
        backend = ctx.backend(side.backend)
        if not isinstance(backend, OpensLeaves):
            raise Forfeit(f"{side.backend} cannot open leaves")
        got = await _asked(ctx, backend.open_leaves(Handle.model_validate_json(side.handle_json), indices),
                           f"leaves {indices}")
        if len(got) != len(indices):
            raise Forfeit(f"asked for {len(indices)} leaves, it opened {len(got)}")
        raw = [o.model_dump() for o in got]
        meter["leaf_bytes"] += sum(_size(o) for o in raw)
        return [(o, check_opening(roots[side.id], size, i, o)) for o, i in zip(raw, indices, strict=True)]

    results = await asyncio.gather(*(one(side) for side in sides), return_exceptions=True)
    forfeits, ours = {}, None
    for side, result in zip(sides, results, strict=True):
        if isinstance(result, Forfeit):
            forfeits[side.id] = result.reason
        elif isinstance(result, VerificationError):
            ours = result.reason
        elif isinstance(result, BaseException):
            raise result
    if ours is not None:
        _undecided(*sides, evidence, ours)
    if forfeits:
        raise _Settled(_forfeited(sides[0], sides[1], forfeits, evidence))
    return {side.id: result for side, result in zip(sides, results, strict=True)}


async def _asked(ctx: JobContext, call, what: str):
    """An executor's answer within the policy's `challenge_deadline_s`: its silence, refusal or garbage is a
    Forfeit; a fault on our side (a full disk) leaves the ruling undecided."""
    from trainmaster.verify.errors import VerificationError
    from trainmaster.verify.referee import Forfeit

    deadline = ctx.policy.verification.challenge_deadline_s
    try:
        return await asyncio.wait_for(call, deadline)
    except asyncio.TimeoutError:
        raise Forfeit(f"it did not open {what} within {deadline:g} s") from None
    except LocalEnvironmentError as exc:
        raise VerificationError(f"opening {what} failed on our side: {exc}", kind="cannot_verify") from exc
    except TransientBackendError as exc:
        raise Forfeit(f"it did not answer for {what} after {ATTEMPTS} tries: {exc}") from None
    except BackendError as exc:
        raise Forfeit(f"it did not open {what}: {exc}") from None


async def _replay(ctx: JobContext, lead: Attempt, partner: Attempt, found, commitments: dict, evidence: dict,
                  meter: dict) -> dict[str, Any]:
    """The one replay, from the agreed state opened by the lead (by the partner when the lead does not open it)."""
    from trainmaster.verify.referee import Forfeit
    from trainmaster.verify.referee_replay import DisputeReplay

    base = DisputeReplay(spec_json=ctx.job.spec_json, seed=lead.seed or ctx.spec.seed, compared=found.compared,
                         segment=found.segment, opened_state=found.opened_state,
                         device=commitments[lead.id].device_kind)
    if found.compared == "initial":
        return await _in_pool(lead, partner, base, evidence)
    forfeits: dict[str, str] = {}
    for side in (lead, partner):
        dest = paths.job_dir(ctx.id) / "openings" / str(side.n) / f"referee-{found.opened_state}"
        await asyncio.to_thread(shutil.rmtree, dest, True)
        backend = ctx.backend(side.backend)
        try:
            await _asked(ctx, backend.open_state(Handle.model_validate_json(side.handle_json), found.opened_state,
                                                 dest), f"the agreed state S_{found.opened_state}")
        except Forfeit as exc:
            forfeits[side.id] = exc.reason
            continue
        meter["state_bytes"] += await asyncio.to_thread(_tree_bytes, dest)
        request = DisputeReplay(**{**base.__dict__, "commitment": commitments[side.id].canonical_json(),
                                   "openings_dir": str(dest)})
        replayed = await _in_pool(lead, partner, request, evidence)
        if replayed.get("blame") == "opened":
            forfeits[side.id] = replayed["failed"]
            continue
        evidence["dispute"] = {**evidence["dispute"], "opened_by": side.id}
        if forfeits:  # the other side would not open what it committed: it forfeits, whatever the replay says
            evidence["forfeits"] = forfeits
        return replayed
    raise _Settled(_forfeited(lead, partner, forfeits, evidence))


async def _in_pool(lead: Attempt, partner: Attempt, request, evidence: dict) -> dict[str, Any]:
    from trainmaster.verify.referee_replay import replay_dispute

    try:
        replayed = await audit_pool.shared.run(replay_dispute, request)
    except audit_pool.PoolDied as exc:
        _undecided(lead, partner, evidence, str(exc))
    if replayed.get("blame") == "ours":
        _undecided(lead, partner, evidence, replayed["failed"])
    return replayed


def _undecided(lead: Attempt, partner: Attempt, evidence: dict, reason: str):
    raise _Settled(_ruling(lead, partner, "undecided", {lead.id: "undecided", partner.id: "undecided"},
                           {lead.id: reason, partner.id: reason}, **evidence))


def _tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


# the ruling applied


async def _apply_to_others(ctx: JobContext, lead: Attempt, ruling: dict[str, Any]) -> None:
    """The partner as ruled: refuted or forfeited, rejected (unpaid, banned); released, ended unpaid. An agreed
    partner waits for the lead's verdict (`accept_agreed`); an upheld one leads once the lead has ended."""
    for other in pairs.members(ctx.store, lead):
        if other.id == lead.id or other.state in states.ATTEMPT_ENDS:
            continue
        finding, reason = ruling["findings"].get(other.id), ruling["reasons"].get(other.id, "")
        if finding in ("refuted", "forfeited"):
            await asyncio.to_thread(_record, ctx, other, "rejected", [f"the referee: {reason}"], ruling)
            await react(ctx, other, failures.REJECTED, f"rejected by the referee: {reason}")
        elif finding == "released":
            await end_attempt(ctx, other, "failed", job_target=None, reason=f"the referee: {reason}")


def _for_lead(ctx: JobContext, lead: Attempt, ruling: dict[str, Any]) -> Judged:
    finding, reason = ruling["findings"][lead.id], ruling["reasons"][lead.id]
    if finding in ("agreed", "upheld"):
        return Judged(ruling)
    if finding == "alone":
        return Judged(ruling, replay=True)
    if finding == "released":
        return Judged(ruling, release=f"the referee: {reason}")
    outcome = "cannot_verify" if finding == "undecided" else "rejected"
    return Judged(ruling, verdict=_record(ctx, lead, outcome, [f"the referee: {reason}"], ruling, lead=True))


def _record(ctx: JobContext, attempt: Attempt, outcome: str, reasons: list[str], ruling: dict[str, Any],
            *, lead: bool = False, **evidence: Any):
    """The attempt's verdict as the referee made it, stored (once: a final one already stored is kept); the lead's
    is also the job's `verdict.json`."""
    from trainmaster.verify.records import VerdictStore
    from trainmaster.verify.verdict import Verdict

    verdicts = VerdictStore(ctx.store.path)
    try:
        found = verdicts.latest(ctx.id, attempt.id)
        if found is not None and found.outcome in ("accepted", "rejected"):
            return found
        verdict = Verdict(outcome=outcome, reasons=reasons, checks=["referee"], evidence={"referee": ruling, **evidence},
                          job_id=ctx.id, attempt_id=attempt.id)
        verdicts.record(verdict)
    finally:
        verdicts.close()
    if lead:
        verdict.write(paths.job_dir(ctx.id) / "verdict.json")
    return verdict


async def accept_agreed(ctx: JobContext, lead: Attempt) -> None:
    """Before the lead is accepted: its agreed partner is accepted too (its own verdict, its own payment)."""
    ruling = stored_ruling(ctx, lead.referee_pair) if lead.referee_pair else None
    if ruling is None:
        return
    for other in pairs.members(ctx.store, lead):
        if other.id == lead.id or other.state in states.ATTEMPT_ENDS or ruling["findings"].get(other.id) != "agreed":
            continue
        await asyncio.to_thread(_record, ctx, other, "accepted", [], ruling, judged_with=lead.id)
        if other.state == "returned":
            ctx.store.move_attempt(other.id, "verifying")
        await end_attempt(ctx, ctx.store.attempt(other.id), "accepted", job_target=None,
                          detail={"verdict": "accepted", "referee": f"its root equals attempt {lead.n}'s, accepted"})
