"""Every call the job commands make on the Broker, one function per command.

Each function opens the Broker, makes all of its command's calls, and returns the broker (the
renderers read its store) with what the command prints; output that must appear while the calls
run (a streamed log) goes through a callback. So when the Broker's methods become coroutines,
only this module changes. Exceptions are left to `exits.guarded`, which the commands wrap around
these functions.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def _broker():
    from trainmaster.broker.service import Broker

    return Broker()


def dry_run(spec: Path, policy: str):
    """`submit --dry-run`: check, bundle in memory and plan; nothing is recorded."""
    broker = _broker()
    return broker, broker.prepare(spec, policy)


def submit(spec: Path, policy: str, *, wait: bool, on_submitted: Callable, on_log: Callable[[str], None] | None):
    """`submit`: start the job; with `wait`, stream its log to `on_log` (when given) and wait for its end.
    `on_submitted(job)` runs as soon as the job is recorded (it may exit)."""
    broker = _broker()
    job = broker.submit(spec, policy)
    on_submitted(job)
    if wait:
        if on_log is not None:
            for line in broker.logs(job.id, follow=True):
                on_log(line)
        job = broker.wait(job.id)
    return broker, job


def status(job_ref: str):
    """`status`: the job (id or unique prefix), advanced to what its attempts say now."""
    broker = _broker()
    job = broker.store.find_job(job_ref)
    return broker, broker.advance(job.id)


def list_jobs(states: set[str] | None, limit: int):
    """`ls`: refresh every unfinished job, then list them, newest first."""
    broker = _broker()
    broker.refresh()
    return broker, broker.store.jobs(states_in=states, limit=limit)


def logs(job_ref: str, *, follow: bool, on_log: Callable[[str], None]) -> None:
    """`logs`: the latest attempt's log to `on_log`; when following, record the job's end afterwards."""
    broker = _broker()
    for line in broker.logs(job_ref, follow=follow):
        on_log(line)
    if follow:
        broker.advance(broker.store.find_job(job_ref).id)


def cancel(job_ref: str):
    """`cancel`: stop the job and record its cost so far."""
    broker = _broker()
    return broker, broker.cancel(job_ref)
