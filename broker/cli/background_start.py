"""Start the background pass (broker/cli/background.py) from a read, and the lock that keeps it one per home.

`start` imports only `os` and `fcntl` (it runs inside `ls`) and never waits for the pass: it spawns it through
a shell that leaves it in the background and exits at once, in a session of its own, stdin from /dev/null and
its output to `<home>/background.log`. The pass holds an exclusive `flock` on `<home>/background.lock` for its
whole life (it goes with the process, `kill -9` included) and writes its pid into it; `start` spawns nothing
while it is held. `TRAINMASTER_BACKGROUND_S` bounds a pass in seconds (default 1800); 0 turns the pass off (the
jobs then advance only in the daemon, `submit --wait` and `resume --wait`).
"""

from __future__ import annotations

import os
import sys

LOCK_NAME = "background.lock"
LOG_NAME = "background.log"
BOUND_ENV = "TRAINMASTER_BACKGROUND_S"
BOUND_S = 1800.0
"""The longest a background pass runs; a later read starts another."""


def bound_s() -> float:
    """How long a pass may run (`TRAINMASTER_BACKGROUND_S`; 0: no pass is started)."""
    try:
        return max(0.0, float(os.environ.get(BOUND_ENV) or BOUND_S))
    except ValueError:
        return BOUND_S


def _lock_path(home) -> str:
    return os.path.join(str(home), LOCK_NAME)


def try_lock(home) -> int | None:
    """An open descriptor holding the home's background lock, or None when another process holds it."""
    from trainmaster.jobs.files import try_exclusive_lock

    try:
        return try_exclusive_lock(_lock_path(home))
    except OSError:
        return None


def running(home) -> bool:
    """Whether a background pass holds this home's lock now (or the lock cannot be taken at all)."""
    fd = try_lock(home)
    if fd is None:
        return True
    os.close(fd)
    return False


def holder(home) -> int | None:
    """The pid of the background pass that holds this home's lock now, or None when none does."""
    if not running(home):
        return None
    try:
        with open(_lock_path(home)) as f:
            return int(f.read().strip() or 0) or None
    except (OSError, ValueError):
        return None


def claimed(fd: int) -> None:
    """Write this process's pid into the lock it holds (`holder`)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def start(home) -> bool:
    """Start a background pass on `home` unless one runs or passes are off; never waits for it. True when one
    was spawned."""
    if bound_s() <= 0:
        return False
    try:
        os.makedirs(str(home), mode=0o700, exist_ok=True)  # a home whose state is on a server may have no folder yet
    except OSError:
        return False
    if running(home):
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
