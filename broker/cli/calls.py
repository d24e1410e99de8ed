"""Every call the job commands make on the Broker, one function per command.

Each function opens the Broker, makes all of its command's calls, and returns what the command
prints (with the broker, whose store the renderers read); output that must appear while the calls
run (a streamed log) goes through a callback. So when the Broker's methods become coroutines,
only this module changes. Exceptions are left to `exits.guarded`, which the commands wrap around
these functions.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from trainmaster.broker.cli.settled import Settled, left_out

if TYPE_CHECKING:
    from trainmaster.broker.store import Store


def _store() -> Store:
    from trainmaster.broker import paths
    from trainmaster.broker.store import Store

    return Store(paths.state_db())


def _settled() -> Settled | None:
    """The state without a Broker when no job is unfinished, no executor awaits its conclusion and no promotion
    is pending, so that `refresh` would do nothing; else None.
    `ls`, and `status` of an ended job, then import neither the service, the planner nor the backends."""
    from trainmaster.broker import states
    from trainmaster.broker.promotion.records import unfinished_exist

    store = _store()
    if (store.jobs(states_in=set(states.JOB_TRANSITIONS) - states.JOB_ENDS, limit=1) or store.awaiting_conclusion()
            or unfinished_exist(store.db)):
        store.close()
        return None
    return Settled(store)


def _daemon():
    """The running daemon of this home, if any: then the command sends requests and only reads state."""
    from trainmaster.broker.cli.daemon_client import running

    return running()


def _daemon_runs() -> bool:
    """Whether this home's daemon process lives (its state file, the pid checked): the reads' test, which sends no
    request, so `ls` and `status` import no HTTP client (broker/cli/daemon_client.py)."""
    from trainmaster.broker.daemon import state_file

    return state_file.read() is not None


def _broker():
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


def _run(main):
    """The one event loop of a command: the broker's coroutines run inside it, and nothing below creates another.
    The audit pool a verification started ends with it."""
    import asyncio

    from trainmaster.broker import audit_pool

    try:
        return asyncio.run(main())
    finally:
        audit_pool.shutdown()


def dry_run(spec: Path, policy: str):
    """`submit --dry-run`: check, bundle in memory and plan; nothing is recorded."""
    return _run(lambda: _broker().prepare(spec, policy))


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


def submit(spec: Path, policy: str, *, wait: bool, on_submitted: Callable, on_log: Callable[[str], None] | None,
           shown: Callable | None = None):
    """`submit`: one bounded reconcile pass (queued jobs start first on what it frees), start the job; with `wait`, stream its log to `on_log`
    (when given; inside `shown`, see `_follow`) and wait for its end. `on_submitted(job, left_out)` runs as
    soon as the job is recorded (it may exit), with the likely secrets its bundle left out."""
    if daemon := _daemon():
        from trainmaster.broker.cli import daemon_calls

        return daemon_calls.submit(daemon, spec, policy, wait=wait, on_submitted=on_submitted, on_log=on_log)
    broker = _broker()

    async def main():
        await _reconciler(broker).run_pass()
        job = await broker.submit(spec, policy)
        on_submitted(job, left_out(broker, job.id))
        return broker, await _waited(broker, job, wait, on_log, shown)

    return _run(main)


def status(job_ref: str, on_note: Callable[[str], None] | None = None):
    """`status`: advance this job only (never another's fetch or audit), then show it. When it cannot be advanced
    for a reason on our side (a full disk, the state database unwritable), the job as last recorded, and
    `on_note(why)`: a read still answers."""
    try:
        return _status(job_ref)
    except Exception as exc:
        why = on_our_side(exc)
        if why is None or on_note is None:
            raise
        on_note(why)
        view = Settled(_readable_store())
        return view, view.store.find_job(job_ref)


def _status(job_ref: str):
    if settled := _settled():
        return settled, settled.store.find_job(job_ref)
    if _daemon_runs():  # it keeps the jobs up to date
        settled = Settled(_store())
        return settled, settled.store.find_job(job_ref)
    broker = _broker()

    async def main():
        job = broker.store.find_job(job_ref)
        return broker, await _reconciler(broker).scoped(job.id)

    return _run(main)


def _readable_store() -> Store:
    """The store to show the state from after a failure on our side: as usual, or read-only when the disk is full."""
    from trainmaster.broker import paths
    from trainmaster.broker.cli.read_only import ReadOnlyStore, disk_full_under

    where = paths.state_db()
    return ReadOnlyStore(where) if disk_full_under(where) else _store()


def on_our_side(exc: BaseException) -> str | None:
    """What stopped a command on our side, when that is what `exc` is: an attempt waiting on our environment
    (broker/failures.py `Waiting`), or a disk too full for the state database; else None."""
    import sqlite3
    import sys

    failures, store = sys.modules.get("trainmaster.broker.failures"), sys.modules.get("trainmaster.broker.store")
    if failures is not None and isinstance(exc, failures.Waiting):
        return str(exc)
    if store is not None and isinstance(exc, store.NotFound):
        return None  # the user's reference, whatever the disk
    from trainmaster.broker import paths
    from trainmaster.broker.cli.read_only import disk_full_under

    if disk_full(exc) or disk_full_under(paths.state_db()):
        return f"the disk is full ({exc}): showing the state as last recorded; free some space"
    if isinstance(exc, sqlite3.OperationalError):
        return f"the state database cannot be written now ({exc}): showing the state as last recorded"
    return None


def disk_full(exc: BaseException) -> bool:
    import errno
    import sqlite3

    if isinstance(exc, sqlite3.OperationalError):
        return "full" in str(exc)
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def list_jobs(states: set[str] | None, limit: int, on_note: Callable[[str], None] | None = None,
              ended_since: float | None = None):
    """`ls`: one bounded reconcile pass, then the jobs, newest first (as last recorded, with `on_note(why)`, when
    the pass cannot write for a reason on our side). With `ended_since`, the jobs not ended and those that ended
    since then (`states` is not used)."""
    try:
        return _list_jobs(states, limit, ended_since)
    except Exception as exc:
        why = on_our_side(exc)
        if why is None or on_note is None:
            raise
        on_note(why)
        view = Settled(_readable_store())
        return view, _listed(view.store, states, limit, ended_since)


def _list_jobs(states: set[str] | None, limit: int, ended_since: float | None):
    if settled := _settled():
        return settled, _listed(settled.store, states, limit, ended_since)
    if _daemon_runs():  # it keeps the jobs up to date
        settled = Settled(_store())
        return settled, _listed(settled.store, states, limit, ended_since)
    broker = _broker()

    async def main():
        await _reconciler(broker).run_pass()
        return broker, _listed(broker.store, states, limit, ended_since)

    return _run(main)


def _listed(store, states: set[str] | None, limit: int, ended_since: float | None) -> list:
    if ended_since is None:
        return store.jobs(states_in=states, limit=limit)
    from trainmaster.broker.states import JOB_ENDS, JOB_TRANSITIONS

    jobs = store.jobs(states_in=set(JOB_TRANSITIONS) - JOB_ENDS, limit=limit)
    jobs += [j for j in store.jobs(states_in=set(JOB_ENDS), limit=limit) if j.updated_at >= ended_since]
    jobs.sort(key=lambda j: (j.created_at, j.id), reverse=True)
    return jobs if limit < 0 else jobs[:limit]


def logs(job_ref: str, *, follow: bool, on_log: Callable[[str], None], shown: Callable | None = None) -> None:
    """`logs`: advance this job only, then the latest attempt's log to `on_log`; when following,
    until the job ends (its end recorded), inside `shown` when given (see `_follow`)."""
    if daemon := _daemon():
        from trainmaster.broker.cli import daemon_calls

        return daemon_calls.logs(daemon, job_ref, follow_=follow, on_log=on_log)
    broker = _broker()

    async def main():
        job = broker.store.find_job(job_ref)
        await _reconciler(broker).scoped_pass(job.id)
        if follow:
            await _follow(broker, job.id, on_log, shown)
            return
        async for text in broker.logs(job.id):
            on_log(text)

    _run(main)


def cancel(job_ref: str):
    """`cancel`: advance this job only, stop it and record its cost so far."""
    if daemon := _daemon():
        from trainmaster.broker.cli import daemon_calls

        return daemon_calls.cancel(daemon, job_ref)
    broker = _broker()

    async def main():
        job = broker.store.find_job(job_ref)
        await _reconciler(broker).scoped_pass(job.id)
        return broker, await broker.cancel(job.id)

    return _run(main)


def resume(job_ref: str, *, wait: bool, max_hours: float | None, max_usd: str | None, on_resumed: Callable,
           on_log: Callable[[str], None] | None, shown: Callable | None = None):
    """`resume`: start a failed or cancelled job again from its last committed segment, its limits raised
    when given; `on_resumed(job, resume_point)` runs once it is started. With `wait`, stream its log to
    `on_log` (when given; inside `shown`, see `_follow`) and wait for its end."""
    if daemon := _daemon():
        from trainmaster.broker.cli import daemon_calls

        return daemon_calls.resume(daemon, job_ref, wait=wait, max_hours=max_hours, max_usd=max_usd,
                                   on_resumed=on_resumed, on_log=on_log)
    broker = _broker()

    async def main():
        job = broker.store.find_job(job_ref)
        await _reconciler(broker).scoped_pass(job.id)
        point = await broker.resume_point(broker.store.job(job.id))
        job = await broker.resume(job.id, max_hours=max_hours, max_usd=max_usd)
        on_resumed(job, point)
        return broker, await _waited(broker, job, wait, on_log, shown)

    return _run(main)


def verify_again(job_ref: str):
    """`verify JOB --again`: run the checks again on the job's unverified attempt."""
    broker = _broker()

    async def main():
        job = broker.store.find_job(job_ref)
        return broker, await broker.verify_again(job.id)

    return _run(main)


def offers(spec, policy):
    """`offers`: what `submit` would plan for the spec under the policy, and whether a budget would refuse it."""
    broker = _broker()

    async def main():
        result = await broker.plan(spec, policy)
        return result, broker.budget_refusal(spec, policy, result)

    return _run(main)
