"""`LocalJobClient`: the `JobClient` (broker/cli/job_client.py) of a home without a running daemon.

Reads (`status`, `list_jobs`, `logs` without `follow`) show the state as recorded and start the bounded
background pass (broker/cli/background.py) when something is left to advance; they never advance a job
themselves. The commands that act (`submit`, `cancel`, `resume`, `verify --again`, a followed log) open a
Broker on this command's one event loop: `submit` runs one bounded reconcile pass first (queued jobs start on
what it frees), `cancel` and `resume` advance the job they name (scoped, under its lease), and with `wait` the
job is driven to its end here. A `submit` or `resume` that does not wait leaves its job to the background pass.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

from trainmaster.broker.cli.settled import Settled, left_out

LOGS_TIMEOUT_S = 30.0
"""The longest `logs` (without --follow) waits for the backend that holds the log."""


def read_status(job_ref: str, *, advance: bool = True):
    """The job as recorded; with `advance`, the background pass started when something is left to advance."""
    from trainmaster.broker.cli.reads import advance_in_background, open_store

    view = Settled(open_store())
    job = view.store.find_job(job_ref)
    if advance:
        advance_in_background(view.store)
    return view, job


def read_jobs(states: set[str] | None, limit: int, ended_since: float | None, *, advance: bool = True):
    from trainmaster.broker.cli.reads import advance_in_background, open_store

    view = Settled(open_store())
    jobs = listed(view.store, states, limit, ended_since)
    if advance:
        advance_in_background(view.store)
    return view, jobs


def listed(store, states: set[str] | None, limit: int, ended_since: float | None) -> list:
    """The jobs in `states` (all: None), newest first, at most `limit` (-1: all); with `ended_since`, the jobs not
    ended and those that ended since then (`states` is not used)."""
    if ended_since is None:
        return store.jobs(states_in=states, limit=limit)
    from trainmaster.broker.states import JOB_ENDS, JOB_TRANSITIONS

    jobs = store.jobs(states_in=set(JOB_TRANSITIONS) - JOB_ENDS, limit=limit)
    jobs += [j for j in store.jobs(states_in=set(JOB_ENDS), limit=limit) if j.updated_at >= ended_since]
    jobs.sort(key=lambda j: (j.created_at, j.id), reverse=True)
    return jobs if limit < 0 else jobs[:limit]


def _ran(broker, main, *, then_background: bool):
    """`main` run on this command's loop; with `then_background` (the job is left unfinished: no `--wait`, or a
    read), the detached background pass that takes it on is started, never waited for (broker/cli/background.py)."""
    done = run(main)
    if then_background:
        from trainmaster.broker.cli.reads import advance_in_background

        advance_in_background(broker.store)
    return done


def new_broker():
    from trainmaster.broker.cli.transfer_bar import TransferBar
    from trainmaster.broker.service import Broker

    return Broker(progress=TransferBar(), upload_progress=TransferBar("uploading"))


def _reconciler(broker):
    """One bounded reconcile pass, or one scoped to a job, under leases held as this command's process; the broker
    runs on the command's own loop (no worker loops: one broker, one job at a time)."""
    import os

    from trainmaster.broker.daemon.leases import Leases
    from trainmaster.broker.daemon.reconciler import Reconciler

    return Reconciler([broker], Leases(broker.store.path), f"cli-{os.getpid()}", loops=None)


def run(main):
    """The one event loop of a command: the broker's coroutines run inside it, and nothing below creates another.
    The audit pool a verification started ends with it."""
    import asyncio

    from trainmaster.broker import audit_pool

    try:
        return asyncio.run(main())
    finally:
        audit_pool.shutdown()


async def _follow(broker, job_id: str, on_log: Callable[[str], None], shown: Callable | None) -> None:
    """The job's log to `on_log` until the job ends; inside `shown(broker, job_id)` (a terminal's status
    line, broker/cli/live.py) when given."""
    async with shown(broker, job_id) if shown else nullcontext():
        async for text in broker.logs(job_id, follow=True):
            on_log(text)


async def _waited(broker, job, wait: bool, on_log: Callable[[str], None] | None, shown: Callable | None):
    """The job as it is now, or with `wait` as it ends (its log streamed to `on_log` when given)."""
    if not wait:
        return job
    if on_log is not None:
        await _follow(broker, job.id, on_log, shown)
    return await broker.wait(job.id)


class LocalJobClient:
    def submit(self, spec: Path, policy: str, *, wait: bool, on_submitted: Callable,
               on_log: Callable[[str], None] | None, shown: Callable | None = None):
        broker = new_broker()

        async def main():
            await _reconciler(broker).run_pass()
            job = await broker.submit(spec, policy)
            on_submitted(job, left_out(broker, job.id))
            return broker, await _waited(broker, job, wait, on_log, shown)

        return _ran(broker, main, then_background=not wait)

    def status(self, job_ref: str):
        return read_status(job_ref)

    def list_jobs(self, states: set[str] | None, limit: int, ended_since: float | None):
        return read_jobs(states, limit, ended_since)

    def logs(self, job_ref: str, *, follow: bool, on_log: Callable[[str], None], shown: Callable | None = None) -> None:
        broker = new_broker()

        async def main():
            import asyncio

            job = broker.store.find_job(job_ref)
            if follow:
                await _reconciler(broker).scoped_pass(job.id)
                await _follow(broker, job.id, on_log, shown)
                return
            async def every_part() -> None:
                async for text in broker.logs(job.id):
                    on_log(text)

            try:  # a read: the log as the backend holds it now, the job not advanced (asyncio.wait_for and its
                await asyncio.wait_for(every_part(), LOGS_TIMEOUT_S)  # TimeoutError: 3.10 has no asyncio.timeout)
            except asyncio.TimeoutError:
                from trainmaster.backends.base import BackendError

                raise BackendError(f"the backend holding {job.id}'s log did not answer within {LOGS_TIMEOUT_S:.0f} s;"
                                   " try again later") from None

        _ran(broker, main, then_background=not follow)

    def cancel(self, job_ref: str):
        broker = new_broker()

        async def main():
            job = broker.store.find_job(job_ref)
            await _reconciler(broker).scoped_pass(job.id)
            return broker, await broker.cancel(job.id)

        return run(main)

    def resume(self, job_ref: str, *, wait: bool, max_hours: float | None, max_usd: str | None,
               on_resumed: Callable, on_log: Callable[[str], None] | None, shown: Callable | None = None):
        broker = new_broker()

        async def main():
            job = broker.store.find_job(job_ref)
            await _reconciler(broker).scoped_pass(job.id)
            point = await broker.resume_point(broker.store.job(job.id))
            job = await broker.resume(job.id, max_hours=max_hours, max_usd=max_usd)
            on_resumed(job, point)
            return broker, await _waited(broker, job, wait, on_log, shown)

        return _ran(broker, main, then_background=not wait)

    def verify_again(self, job_ref: str):
        broker = new_broker()

        async def main():
            job = broker.store.find_job(job_ref)
            return broker, await broker.verify_again(job.id)

        return run(main)
