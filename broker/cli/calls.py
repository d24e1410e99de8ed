"""Every call the job commands make, one function per command, through one `JobClient` (broker/cli/job_client.py):
the daemon's when this home's daemon runs, else the local one.

Each function returns what its command prints (with a view whose `.store` the renderers read); output that must
appear while the calls run (a streamed log) goes through a callback. Reads (`status`, `list_jobs`, `logs` without
follow) never advance a job: the daemon, or the bounded background pass a read starts (broker/cli/background.py),
does. Exceptions are left to `exits.guarded`, which the commands wrap around these functions.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trainmaster.broker.cli.job_client import client
from trainmaster.broker.cli.settled import Settled

if TYPE_CHECKING:
    from trainmaster.broker.store import Store


def _store() -> Store:
    from trainmaster.broker.cli.reads import open_store

    return open_store()


def dry_run(spec: Path, policy: str):
    """`submit --dry-run`: check, bundle in memory and plan; nothing is recorded."""
    from trainmaster.broker.cli.local_jobs import new_broker, run

    return run(lambda: new_broker().prepare(spec, policy))


def submit(spec: Path, policy: str, *, wait: bool, on_submitted: Callable, on_log: Callable[[str], None] | None,
           shown: Callable | None = None):
    """`submit`: start the job (locally after one bounded reconcile pass); with `wait`, stream its log to `on_log`
    (when given; inside `shown`) and wait for its end. `on_submitted(job, left_out)` runs as soon as the job is
    recorded (it may exit), with the likely secrets its bundle left out."""
    return client().submit(spec, policy, wait=wait, on_submitted=on_submitted, on_log=on_log, shown=shown)


def status(job_ref: str, on_note: Callable[[str], None] | None = None):
    """`status`: the job as recorded (a read: the daemon or the background pass advances it). When the state
    cannot be read as usual for a reason on our side (a full disk), or the job waits on our side as last recorded
    (broker/cli/reads.py `waiting_on_us`), the job as last recorded, and `on_note(why)`."""
    try:
        view, job = client(reading=True).status(job_ref)
    except Exception as exc:
        why = on_our_side(exc)
        if why is None or on_note is None:
            raise
        on_note(why)
        view = Settled(_readable_store())
        return view, view.store.find_job(job_ref)
    if on_note is not None:
        from trainmaster.broker.cli.reads import waiting_on_us

        if why := waiting_on_us(view.store, job):
            on_note(why)
    return view, job


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
    """`ls`: the jobs as recorded, newest first (a read), or as last recorded with `on_note(why)` when the state
    cannot be read as usual for a reason on our side. With `ended_since`, the jobs not ended and those that ended
    since then (`states` is not used)."""
    try:
        return client(reading=True).list_jobs(states, limit, ended_since)
    except Exception as exc:
        why = on_our_side(exc)
        if why is None or on_note is None:
            raise
        on_note(why)
        from trainmaster.broker.cli.local_jobs import listed

        view = Settled(_readable_store())
        return view, listed(view.store, states, limit, ended_since)


def logs(job_ref: str, *, follow: bool, on_log: Callable[[str], None], shown: Callable | None = None) -> None:
    """`logs`: the latest attempt's log to `on_log` (a read: the job is not advanced); when following, until the
    job ends, inside `shown` when given."""
    return client().logs(job_ref, follow=follow, on_log=on_log, shown=shown)


def cancel(job_ref: str):
    """`cancel`: stop the job and record its cost so far."""
    return client().cancel(job_ref)


def resume(job_ref: str, *, wait: bool, max_hours: float | None, max_usd: str | None, on_resumed: Callable,
           on_log: Callable[[str], None] | None, shown: Callable | None = None):
    """`resume`: start a failed or cancelled job again from its last committed segment, its limits raised
    when given; `on_resumed(job, resume_point)` runs once it is started. With `wait`, stream its log to
    `on_log` (when given; inside `shown`) and wait for its end."""
    return client().resume(job_ref, wait=wait, max_hours=max_hours, max_usd=max_usd, on_resumed=on_resumed,
                           on_log=on_log, shown=shown)


def verify_again(job_ref: str):
    """`verify JOB --again`: run the checks again on the job's unverified attempt."""
    return client().verify_again(job_ref)


def offers(spec, policy):
    """`offers`: what `submit` would plan for the spec under the policy, and whether a budget would refuse it."""
    from trainmaster.broker.cli.local_jobs import new_broker, run

    broker = new_broker()

    async def main():
        result = await broker.plan(spec, policy)
        return result, broker.budget_refusal(spec, policy, result)

    return run(main)
