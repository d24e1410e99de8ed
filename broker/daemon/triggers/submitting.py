"""The engine's two hooks on the real broker: an idempotent submit and the budget gate.

`broker_submit(broker)` submits a fire's job with the fire's key kept in the job's first event, and returns
the job already made under that key when there is one: a process killed after the broker recorded the job but
before the fire recorded its id submits nothing twice. `broker_gate(broker)` says why the broker would refuse
the run now: the budget check `submit` makes (`Broker.prepare`), or the spec or plan that cannot be used.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from trainmaster.broker.planning.planner import PlanError
from trainmaster.broker.service import Broker
from trainmaster.broker.store import Store
from trainmaster.jobs.yamlfile import FileError

from .engine import Gate, Submit


def broker_submit(broker: Broker) -> Submit:
    async def submit(spec_path: Path, policy: str, reason: str, key: str) -> str:
        made = await asyncio.to_thread(job_for_key, broker.store, key)
        if made is not None:
            return made
        job = await broker.submit(spec_path, policy, origin={"trigger_key": key, "reason": reason})
        return job.id

    return submit


def broker_gate(broker: Broker) -> Gate:
    async def gate(spec_path: Path, policy: str) -> str | None:
        try:
            prepared = await broker.prepare(spec_path, policy)
        except (FileError, PlanError) as exc:
            return f"cannot be submitted now: {exc}"
        return prepared.budget

    return gate


def job_for_key(store: Store, key: str) -> str | None:
    """The job a submit with this idempotency key made, if any."""
    from trainmaster.broker.store import job_submitted_with

    return job_submitted_with(store.db, "trigger_key", key)
