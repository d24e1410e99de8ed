"""The accepted predecessor of a job, for the outcome check's no-regression rule (10 %): the newest
accepted attempt of an earlier job of the same name, and the metrics the broker's own outcome check
measured for it (its stored verdict), never what that run reported about itself."""

from __future__ import annotations

from trainmaster.broker.store import Job, Store


def previous_metrics(store: Store, job: Job) -> dict[str, float] | None:
    """The evaluated metrics of the job's accepted predecessor; None when it has none (its first run,
    or a predecessor accepted without an outcome check)."""
    from trainmaster.verify.records import VerdictStore

    earlier = [a for a, _ in store.accepted_runs(job.name, 2) if a.job_id != job.id]
    if not earlier:
        return None
    verdicts = VerdictStore(store.path)
    try:
        verdict = verdicts.latest(earlier[0].job_id, earlier[0].id)
    finally:
        verdicts.close()
    outcome = (verdict.evidence.get("outcome") or {}) if verdict is not None else {}
    return dict(outcome["metrics"]) if outcome.get("metrics") else None
