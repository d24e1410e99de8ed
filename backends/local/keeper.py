"""The keeper: the parent of one attempt's supervisor, so that nothing the job started outlives it.

The local backend starts this (detached); it takes the attempt's keeper lock (a second keeper of the same
attempt, started by a launch repeated after its launcher died, finds it held and exits: launching.py) and
hands it on to the supervisor, then makes itself the child subreaper of everything below it
(Linux `prctl(PR_SET_CHILD_SUBREAPER)`), then starts the supervisor in a session of its own and waits.
A process of the job whose parent dies — a `bash -c` command's children when bash is killed, a
background job (`&`), a double-forked daemon, a child in a new session — is then re-parented to the
keeper instead of to init, so it stays below the keeper and can be found.

When the supervisor ends, however it ends (a `kill -9` included), the keeper stops every process still
below it: SIGTERM, up to `GRACE_S` to exit, then SIGKILL (at once when the
supervisor finished normally: it has already given the job's leftovers their grace), and exits. It
records nothing: a supervisor that died without `exit.json` has its end recorded by the backend, as before.

Standard library and psutil only, so the supervisor starts without delay.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
KEEPER_LOCK = "keeper.lock"
"""Held (flock) by the keeper from its start, and by the supervisor it hands it to: one keeper per attempt
(launching.py)."""
POLL_S = 0.05
GRACE_S = 5.0  # what a process asked to stop gets before SIGKILL (the supervisor uses it for leftovers too)


def become_subreaper() -> None:
    """Orphaned descendants come to this process rather than to init (Linux; nothing elsewhere)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def main(workdir: Path) -> int:
    lock = hold_lock(workdir)
    if lock is None:
        return 0  # another keeper runs this attempt (a launch repeated after its launcher died: launching.py)
    become_subreaper()
    with open(workdir / "supervisor.err", "ab") as err:
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "trainmaster.backends.local.supervisor", str(workdir)],
            cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            start_new_session=True, close_fds=True, pass_fds=(lock,),  # the lock stays held while either lives
        )
    code = wait_for(supervisor.pid)
    stop_descendants(grace=0.0 if code == 0 else GRACE_S)
    return 0


def hold_lock(workdir: Path) -> int | None:
    """The attempt's keeper lock, taken (its fd); None when another keeper holds it."""
    from trainmaster.jobs.files import try_exclusive_lock

    return try_exclusive_lock(workdir / KEEPER_LOCK)


def wait_for(pid: int) -> int:
    """Reap children (adopted orphans among them) until `pid` ends; its exit status (negative: killed by a signal)."""
    while True:
        done, status = os.waitpid(-1, 0)
        if done == pid:
            return os.waitstatus_to_exitcode(status)


def stop_descendants(*, grace: float) -> None:
    """SIGTERM to every process below this one, up to `grace` seconds for them to go, then SIGKILL until none is left."""
    deadline = time.time() + grace
    if grace > 0:
        _signal_all(signal.SIGTERM)
        while _reap_and_list() and time.time() < deadline:
            time.sleep(POLL_S)
    while _signal_all(signal.SIGKILL):  # a process forked meanwhile is found on the next pass
        time.sleep(POLL_S)


def _signal_all(sig: int) -> bool:
    """Send `sig` to every live descendant; whether there was any."""
    import psutil

    live = _reap_and_list()
    for proc in live:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass
    return bool(live)


def _reap_and_list():
    """Reap the children that ended, then the live descendants (zombies are dead)."""
    import psutil

    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
    live = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                live.append(proc)
        except psutil.Error:
            continue
    return live


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
