"""A job as JSON: the one view the CLI's `--json` output and the daemon's API both give, read from the state.

It reads the store (the job, its attempts, their outputs and events) and the verdicts stored for its ended
attempts, and nothing else: no backend, no broker. Below both the CLI (broker/cli/) and the daemon
(broker/daemon/api.py), which only serialise it.
"""

from __future__ import annotations

from trainmaster.broker import paths
from trainmaster.broker.store import Attempt, Job, Store
from trainmaster.jobs.money import format_usd

SHARED_EVENT = "shared"
"""The event that records where an accepted job's outputs were put in the shared storage (broker/filekeeping/shared_outputs.py)."""


def job_json(store: Store, job: Job, *, events: bool = False) -> dict:
    """The job, its attempts (each with its outputs and what its verdict says), its payments and, with `events`,
    its event log. An untrusted executor's attempt shows the times and cost the broker measured
    (broker/attempt_view.py), what the executor claimed beside them."""
    from trainmaster.broker import attempt_view

    attempts = store.attempts(job.id)
    verdicts = _verdicts(store, job, attempts)
    logged = store.events(job.id) if events or any(map(attempt_view.untrusted, attempts)) else []
    shown = {a.id: attempt_view.times(a, logged) for a in attempts}
    out = {
        "id": job.id, "name": job.name, "workload": job.workload, "project": job.project, "state": job.state,
        "reason": job.reason, "policy": job.policy, "bundle_sha256": job.bundle_sha256, "spec_path": job.spec_path,
        "created_at": job.created_at, "updated_at": job.updated_at,
        "queue_position": store.queue_position(job.id),
        "cost_micro_usd": sum(map(attempt_view.cost, attempts)),
        "cost_usd": format_usd(sum(map(attempt_view.cost, attempts))),
        "job_dir": str(paths.job_dir(job.id)),
        "outputs_dir": str(paths.job_dir(job.id) / "outputs") if job.state == "accepted" else None,
        "outputs_url": shared_outputs_url(store, job.id) if job.state == "accepted" else None,
        "attempts": [
            {"id": a.id, "backend": a.backend, "state": a.state, "reason": a.reason, "started_at": shown[a.id][0],
             "ended_at": shown[a.id][1], "cost_micro_usd": attempt_view.cost(a), "billable_seconds": a.billable_seconds,
             **({"executor_claimed": {"started_at": a.started_at, "ended_at": a.ended_at},
                 "recorded_micro_usd": a.cost_micro_usd} if attempt_view.untrusted(a) else {}),
             "outputs": [{"path": p, "size": s, "sha256": h} for p, s, h in store.outputs(a.id)],
             **_from_verdict(verdicts.get(a.id))}
            for a in attempts
        ],
    }
    from trainmaster.broker.payment_states import payment_states

    out["payments"] = [p.to_json() for p in payment_states(store.db, job_id=job.id)]
    if events:
        out["events"] = [
            {"at": e.at, "attempt": e.attempt_id, "kind": e.kind, "from": e.from_state, "to": e.to_state, "detail": e.detail}
            for e in logged
        ]
    return out


def shared_outputs_url(store: Store, job_id: str) -> str | None:
    """Where the job's outputs were put in the shared storage: the `shared` event's record."""
    return next((e.detail["outputs"] for e in reversed(store.events(job_id)) if e.kind == SHARED_EVENT), None)


def _verdicts(store: Store, job: Job, attempts: list[Attempt]) -> dict:
    """attempt id -> the stored verdict (its JSON) of each attempt that has one (accepted or rejected)."""
    ended = [a for a in attempts if a.state in ("accepted", "rejected")]
    if not ended:
        return {}
    from trainmaster.verify.records import VerdictStore

    if getattr(store, "read_only", False):
        return {}  # the disk is full (broker/cli/read_only.py): the verdicts' details wait for space
    verdicts = VerdictStore(store.path)
    try:
        found = {a.id: verdicts.latest_evidence(job.id, a.id) for a in ended}
    finally:
        verdicts.close()
    return {attempt_id: v for attempt_id, v in found.items() if v is not None}


def _from_verdict(verdict) -> dict:
    """What `status` shows of a verdict: the opaque outputs it lists (pickle-capable files kept, never loaded),
    the files dropped as not bound to an untrusted executor's commitment, and the metrics of the broker's
    own evaluation."""
    if verdict is None:
        return {"opaque": [], "dropped": [], "metrics": None}
    evidence = verdict.get("evidence") or {}
    return {"opaque": [{"path": o["path"], "kind": o["kind"], "what": o["what"]}
                       for o in (evidence.get("safety") or {}).get("opaque", [])],
            "dropped": list((evidence.get("integrity") or {}).get("dropped", [])),
            "metrics": (evidence.get("outcome") or {}).get("metrics")}
