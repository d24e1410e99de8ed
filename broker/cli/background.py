"""The bounded background pass a read starts, so jobs advance without a daemon and no read waits for them.

`ls`, `status` and `logs` only read the state. When the home has unfinished work (broker/cli/reads.py
`unfinished`) and no daemon runs, such a read calls `start`, which spawns this module as a detached process
(its own session, stdin and stdout away from the caller) and returns at once. The process holds an exclusive
lock on `<home>/background.lock` for its whole life, so at most one runs per home (the lock goes with the
process, `kill -9` included); it runs reconcile passes (broker/daemon/reconciler.py: each job under its lease in
the database, so it never races a daemon, a `submit --wait` or another machine) every POLL_S seconds while a job
is moving, and exits when nothing is left to move, when a daemon starts (it advances the jobs then), when its
home is gone, or after BOUND_S seconds (`TRAINMASTER_BACKGROUND_S`); a later read starts another. Work that
waits on something else (a verdict to settle with an executor, a promotion into a registry, a job waiting for
`verify --again`) gets one pass, whose own retry delays keep a server that is down from being asked again
at once. What it logs goes to `<home>/background.log`.

`start` itself imports only `os` and `fcntl` (it runs inside `ls`); `main` imports the broker.
"""

from __future__ import annotations

import os
import sys
import time

BOUND_ENV = "TRAINMASTER_BACKGROUND_S"
BOUND_S = 1800.0
"""The longest a background pass runs; a later read starts another."""
POLL_S = 1.0
LOCK_NAME = "background.lock"
LOG_NAME = "background.log"


def _lock_path(home) -> str:
    return os.path.join(str(home), LOCK_NAME)


def _try_lock(home) -> int | None:
    """An open descriptor holding the home's background lock, or None when another process holds it."""
    import fcntl

    try:
        fd = os.open(_lock_path(home), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def running(home) -> bool:
    """Whether a background pass holds this home's lock now (or the lock cannot be taken at all)."""
    fd = _try_lock(home)
    if fd is None:
        return True
    os.close(fd)
    return False


def start(home) -> bool:
    """Start a background pass on `home` unless one runs; never waits for it. True when one was spawned."""
    if not os.path.isdir(str(home)) or running(home):
        return False
    log = os.open(os.path.join(str(home), LOG_NAME), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                   (os.POSIX_SPAWN_DUP2, log, 1), (os.POSIX_SPAWN_DUP2, log, 2)]
        # through a shell that leaves it in the background and exits at once: the pass is nobody's child to wait
        # for (no zombie under a long command), and this command waits only for the shell (a few milliseconds)
        shell = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", 'exec "$0" -m trainmaster.broker.cli.background &',
                                           sys.executable], dict(os.environ), file_actions=actions, setsid=True)
        os.waitpid(shell, 0)
    except OSError:
        return False
    finally:
        os.close(log)
    return True


def bound_s() -> float:
    try:
        return float(os.environ.get(BOUND_ENV) or BOUND_S)
    except ValueError:
        return BOUND_S


def main() -> int:
    from trainmaster.broker import paths

    home = paths.home()
    fd = _try_lock(home)
    if fd is None:
        return 0  # another background pass has this home
    try:
        return _passes(home)
    finally:
        os.close(fd)


def _passes(home) -> int:
    import asyncio
    import logging

    from trainmaster.broker import audit_pool
    from trainmaster.broker.cli.reads import unfinished
    from trainmaster.broker.daemon import state

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s background[{os.getpid()}] %(levelname)s %(message)s")
    log = logging.getLogger("trainmaster.background")
    deadline = time.monotonic() + bound_s()

    async def run() -> None:
        reconciler = None
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
