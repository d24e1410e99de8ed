"""What the read-only job commands read, without a Broker: the state as last recorded, and a background pass
started (never waited for) when something is left to advance.

`ls`, `status` and `logs` import neither the service, the planner nor the backends, and never wait on a
registry or a cloud: the daemon advances the jobs when it runs; otherwise a read starts the bounded background
pass (broker/cli/background.py) and shows what is recorded now. Kept free of typer and Rich: the lean read
path (broker/cli/lean.py) runs it before either is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainmaster.broker.store import Store


def open_store() -> Store:
    from trainmaster.broker import paths
    from trainmaster.broker.store import Store

    return Store(paths.state_db())


def unfinished(store: Store | None = None) -> tuple[bool, bool]:
    """(moving, waiting): whether a job is left that moves by itself (dispatched, running, queued, returned…),
    and whether other work waits (a verdict to settle with an executor, a payment not sent yet, a promotion into
    the model registry, a job waiting for `verify --again`)."""
    from trainmaster.broker import states
    from trainmaster.broker.promotion.records import unfinished_exist
    from trainmaster.wallet.payments import any_unsent

    own = store is None
    store = store or open_store()
    try:
        open_states = set(states.JOB_TRANSITIONS) - states.JOB_ENDS
        moving = bool(store.jobs(states_in=open_states - states.WAITING, limit=1))
        waiting = (bool(store.jobs(states_in=set(states.WAITING), limit=1)) or store.awaiting_conclusion()
                   or any_unsent(store.db)
                   or unfinished_exist(store.db))
        return moving, waiting
    finally:
        if own:
            store.close()


def daemon_runs() -> bool:
    """Whether this home's daemon process lives (its state file, the pid checked; no request sent)."""
    from trainmaster.broker.daemon import state_file as state

    return state.read() is not None


def advance_in_background(store: Store) -> bool:
    """Start the background pass when something is left to advance and no daemon does it; True when started.
    Never waits for it, and never fails a read: a pass that cannot start is started by the next read."""
    try:
        if not any(unfinished(store)) or daemon_runs():
            return False
        from trainmaster.broker import paths
        from trainmaster.broker.cli import background_start

        return background_start.start(paths.home())
    except Exception:  # noqa: BLE001 — the read answers whatever happens to the pass it would start
        return False


def waiting_on_us(store: Store, job) -> str | None:
    """What the job waits on our side for, as last recorded (broker/failures.py `Waiting`: a full disk, with what
    to fix), when that is the last thing recorded on an unfinished job; else None."""
    from trainmaster.broker import states

    if job.state in states.JOB_ENDS:
        return None
    events = store.events(job.id)
    last = events[-1] if events else None
    if last is None or last.kind != "error" or not isinstance(last.detail, dict):
        return None
    return last.detail.get("message") if last.detail.get("cause") == "our_environment" else None
