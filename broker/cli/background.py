"""The bounded background pass a read starts, so jobs advance without a daemon and no read waits for them.

`ls`, `status` and `logs` only read the state. When the home has unfinished work (broker/cli/reads.py
`unfinished`) and no daemon runs, such a read calls `background_start.start`, which spawns this module as a detached process
(its own session, stdin and stdout away from the caller) and returns at once. The process holds an exclusive
lock on `<home>/background.lock` for its whole life, so at most one runs per home (the lock goes with the
process, `kill -9` included); it runs reconcile passes (broker/daemon/reconciler.py: each job under its lease in
the database, so it never races a daemon, a `submit --wait` or another machine) every POLL_S seconds while a job
is moving, and exits when nothing is left to move, when a daemon starts (it advances the jobs then), when its
home is gone, after FAILING_PASSES passes in a row that failed on every job they took, or after BOUND_S
seconds (`TRAINMASTER_BACKGROUND_S`; 0: no pass is started); a later read starts another. Work that
waits on something else (a verdict to settle with an executor, a promotion into a registry, a job waiting for
`verify --again`) gets one pass, whose own retry delays keep a server that is down from being asked again
at once. What it logs goes to `<home>/background.log`.

broker/cli/background_start.py starts it (imports only `os` and `fcntl`: it runs inside `ls`); `main` imports
the broker.
"""

from __future__ import annotations

import os
import sys
import time

POLL_S = 1.0
FAILING_PASSES = 5
"""A pass that fails on every job it takes, this many times in a row, stops (a later read starts another)."""


def main() -> int:
    from trainmaster.broker import paths

    from trainmaster.broker.cli.background_start import claimed, try_lock

    home = paths.home()
    fd = try_lock(home)
    if fd is None:
        return 0  # another background pass has this home
    try:
        claimed(fd)
        return _passes(home)
    finally:
        os.close(fd)


def _passes(home) -> int:
    import asyncio
    import logging

    from trainmaster.broker import audit_pool
    from trainmaster.broker.cli.background_start import bound_s
    from trainmaster.broker.cli.reads import unfinished
    from trainmaster.broker.daemon import state_file as state

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s background[{os.getpid()}] %(levelname)s %(message)s")
    log = logging.getLogger("trainmaster.background")
    deadline = time.monotonic() + bound_s()

    async def run() -> None:
        reconciler, failing = None, 0
        while time.monotonic() < deadline and os.path.isdir(str(home)) and state.read() is None:
            moving, waiting = unfinished()
            if not (moving or waiting):
                return
            reconciler = reconciler or _reconciler()
            result = await reconciler.run_pass()
            if result.advanced or result.errors:
                log.info("pass: advanced %s, errors %s (%.1f s)", result.advanced, result.errors, result.seconds)
            if not moving:
                return  # what waits on others has had its pass; a later read starts another
            failing = failing + 1 if result.errors and not set(result.advanced) - set(result.errors) else 0
            if failing >= FAILING_PASSES:
                log.info("stopping: the last %d passes failed on every job they took (%s)", failing, result.errors)
                return  # recorded on the jobs; a later read tries again
            await asyncio.sleep(POLL_S)

    try:
        asyncio.run(run())
    except Exception:  # noqa: BLE001 — nobody is there to see it but the log; the next read starts another pass
        log.exception("the background pass stopped")
        return 1
    finally:
        audit_pool.shutdown()
    return 0


def _reconciler():
    from trainmaster.broker.daemon.leases import Leases
    from trainmaster.broker.daemon.reconciler import Reconciler
    from trainmaster.broker.service import Broker

    broker = Broker()
    return Reconciler([broker], Leases(broker.store.path), f"background-{os.getpid()}", loops=None)


if __name__ == "__main__":
    sys.exit(main())
