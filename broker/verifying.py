"""One attempt's verification pipeline, run in the audit pool (broker/audit_pool.py) instead of on the broker.

What crosses to the worker is picklable: the pipeline's request (paths, the spec, tuples), the checks, the state
database's path, the audit settings and the broker's environment as it is now (a worker started earlier must
judge with today's settings: the evaluator runs with them). The challenged segments are opened by asking the
broker (broker/segment_channel.py). A worker process that dies, on every try, is our failure: the verdict is
`cannot_verify` (recorded; nothing is paid or blocked, `trainmaster verify JOB --again` runs it again).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trainmaster.broker import audit_pool, segment_channel

if TYPE_CHECKING:
    from trainmaster.verify.pipeline import Attempt, AuditSettings
    from trainmaster.verify.verdict import Verdict


@dataclass(frozen=True)
class VerifyCall:
    """What the worker runs: `pipeline.verify_attempt(request, ...)` under `environment`."""

    request: Attempt
    checks: tuple[str, ...]
    db_path: Path | str
    """The state database: a SQLite file's path or a `postgresql://` URL (never made a Path: that mangles a URL)."""
    audit_settings: AuditSettings
    environment: dict[str, str]


def run_call(call: VerifyCall) -> Verdict:
    """In the worker: take the broker's environment, then run the pipeline (which records the verdict)."""
    from trainmaster.verify import pipeline

    os.environ.clear()
    os.environ.update(call.environment)
    return pipeline.verify_attempt(call.request, checks=call.checks, db_path=call.db_path,
                                   audit_settings=call.audit_settings)


async def verify(request: Attempt, *, checks: Collection[str], db_path: Path | str, audit_settings: AuditSettings,
                 opener: segment_channel.Opener | None = None,
                 pool: audit_pool.AuditPool | None = None) -> Verdict:
    """The attempt's verdict, its pipeline run in the pool; `opener` opens the challenged segments (an executor
    that keeps them), served to the worker for as long as the verification runs."""
    pool = pool or audit_pool.shared
    call = VerifyCall(request, tuple(checks), db_path, audit_settings, dict(os.environ))
    try:
        if opener is None:
            return await pool.run(run_call, call)
        async with segment_channel.serving(opener) as ask:
            return await pool.run(run_call, dataclasses.replace(call, request=dataclasses.replace(
                request, open_segments=ask)))
    except audit_pool.PoolDied as exc:
        return await asyncio.to_thread(_record_ours, request, db_path, str(exc))


def _record_ours(request: Attempt, db_path: Path | str, reason: str) -> Verdict:
    """The `cannot_verify` verdict of a verification that could not run to its end, recorded."""
    from trainmaster.verify.records import VerdictStore
    from trainmaster.verify.verdict import Verdict

    verdict = Verdict(outcome="cannot_verify", reasons=[reason], checks=[], evidence={"verification_died": reason},
                      job_id=request.job_id, attempt_id=request.attempt_id)
    verdicts = VerdictStore(db_path)
    try:
        verdicts.record(verdict)
    finally:
        verdicts.close()
    return verdict
