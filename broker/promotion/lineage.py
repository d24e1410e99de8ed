"""The lineage of an accepted job, gathered from the broker's records: its job and spec, bundle, the
commitment root its verdict checked, the verdict (and its row id, which names its evidence), the metrics the
broker's outcome check measured (else the run's own `result.json` numbers, for the record only: the gate
compares thresholded metrics, which an accepted job always had measured), and its cost from the ledger."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from trainmaster.broker import paths
from trainmaster.broker.promotion.records import Lineage
from trainmaster.broker.store import Attempt, Job, Store

RESULT_FILE = "result.json"
CHECKPOINTS = "checkpoints/"


class NotAccepted(ValueError):
    """The job has no accepted attempt (nothing to promote)."""


def lineage_of(store: Store, job_id: str) -> Lineage:
    job = store.job(job_id)
    attempt = accepted_attempt(store, job)
    verdict, verdict_id = _verdict(store, job.id, attempt.id)
    evidence = verdict.get("evidence") or {}
    commitment = evidence.get("commitment") or {}
    measured = (evidence.get("outcome") or {}).get("metrics")
    return Lineage(
        job_id=job.id, attempt_id=attempt.id, job_name=job.name,
        spec_sha256=hashlib.sha256(job.spec_json.encode("utf-8")).hexdigest(), bundle_sha256=job.bundle_sha256,
        commitment_root=commitment.get("root"), verdict=verdict.get("outcome", "accepted"),
        verdict_id=verdict_id, metrics=dict(measured) if measured else _reported(job.id),
        thresholds=dict((json.loads(job.spec_json).get("verification") or {}).get("thresholds") or {}),
        cost_micro_usd=_cost(store, job.id),
    )


def accepted_attempt(store: Store, job: Job) -> Attempt:
    """The accepted attempt whose outputs the job kept (a refereed pair's partner, accepted with its lead, has none)."""
    accepted = [a for a in store.attempts(job.id) if a.state == "accepted"]
    if job.state != "accepted" or not accepted:
        raise NotAccepted(f"job {job.id} is {job.state}, not accepted: it has no checkpoint to promote")
    return ([a for a in accepted if store.outputs(a.id)] or accepted)[-1]


def model_files(store: Store, lineage: Lineage) -> list[Path]:
    """The accepted attempt's kept outputs outside its checkpoint segments (the final model, its result and
    commitment): what the registry's version holds as artifacts."""
    outputs = paths.job_dir(lineage.job_id) / "outputs"
    return [outputs / path for path, _, _ in store.outputs(lineage.attempt_id)
            if not path.startswith(CHECKPOINTS) and (outputs / path).is_file()]


def _verdict(store: Store, job_id: str, attempt_id: str) -> tuple[dict, int | None]:
    """The attempt's newest verdict as stored (JSON) and its row id."""
    from trainmaster.verify.records import VerdictStore

    verdicts = VerdictStore(store.path)
    try:
        return verdicts.latest_evidence(job_id, attempt_id) or {}, verdicts.latest_id(job_id, attempt_id)
    finally:
        verdicts.close()


def _reported(job_id: str) -> dict[str, float]:
    """The numbers of the run's own result.json (self-reported), or none."""
    try:
        value = json.loads((paths.job_dir(job_id) / "outputs" / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(value, dict):
        return {}
    return {k: float(v) for k, v in value.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def _cost(store: Store, job_id: str) -> int:
    """What the job was charged, every attempt together (micro-USD, from the ledger)."""
    from trainmaster.wallet.ledger import Ledger

    ledger = Ledger(store.db)
    return sum(e.micro_usd for e in ledger.entries(job_id=job_id) if e.kind == "charge")
