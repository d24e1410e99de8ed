"""Which processes belong to one local attempt, and stopping them: shared by the supervisor (which
stops what a finished job left running) and the backend (which stops what a dead supervisor left).

A process belongs to the attempt when it started no earlier than the attempt's supervisor and

- carries the attempt's output directory in its environment (`TRAINMASTER_OUTPUT_DIR`): everything
  the job starts inherits it, torchrun's workers too, which torchrun puts each in a session of its
  own, out of the supervisor's process group; or
- sits in the supervisor's process group or session (the supervisor leads both) and started while
  the supervisor lived (`until`): a process that cleared its environment, or pip building the job's
  virtualenv. Once the supervisor is dead its pid, and with it the group's number, can be given to
  another process, so a process started since is never taken for ours by its group alone.

"Started no earlier", "started while the supervisor lived" (against the last heartbeat, which the supervisor writes
in seconds since boot) and "is still the supervisor" compare start times that no change of the wall clock moves
(jobs/process_start.py): compared by psutil's create_time, a live supervisor would look like another process
after a step of the clock, and its job would be killed as dead. A supervisor's record names its boot too
(`boot_id`): after a reboot nothing of the attempt lives, whatever pid and start a process of the new boot has (a
supervisor taken for alive there would leave its job running forever).

Linux and macOS (psutil); a process of another user is never matched (its environment is unreadable).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

from trainmaster.jobs.environment import OUTPUT_DIR
from trainmaster.jobs.process_start import boot_id, now_since_boot, same_start, started_since_boot, this_boot

KILL_WAIT_S = 5.0
POLL_S = 0.05


def identity(pid: int) -> dict:
    """What the supervisor records of itself to be told from a later process given its pid: its start as the wall
    clock read it (`create_time`) and, on Linux, since boot (`since_boot`) and the boot (`boot_id`)."""
    record = {"pid": pid, "create_time": psutil.Process(pid).create_time()}
    since_boot, boot = started_since_boot(pid), boot_id()
    return {**record, **({} if since_boot is None else {"since_boot": since_boot}),
            **({} if boot is None else {"boot_id": boot})}


def is_running(record: dict) -> bool:
    """Whether the process `identity` recorded still runs (not a zombie, not a later process given its pid). By its
    start since boot when recorded (exact whatever the clock did since); else (macOS, a record of an older version)
    by its wall-clock start, to 0.01 s. Never a process of an earlier boot than the record's."""
    if not this_boot(record.get("boot_id")):
        return False
    try:
        proc = psutil.Process(record["pid"])
        if record.get("since_boot") is not None and (now := started_since_boot(record["pid"])) is not None:
            same = same_start(record["since_boot"], now)
        else:
            same = abs(proc.create_time() - record["create_time"]) < 0.01
        return same and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _started_before(proc: psutil.Process, record: dict) -> bool:
    """Whether `proc` started before the recorded supervisor (by their starts since boot where both are known)."""
    if record.get("since_boot") is not None and (since_boot := started_since_boot(proc.pid)) is not None:
        return since_boot < record["since_boot"]
    return proc.info["create_time"] < record["create_time"] - 0.01


HEARTBEAT_BYTES = 32


def heartbeat_since_boot(path: Path) -> float | None:
    """The moment the supervisor's heartbeat file says it was last alive, in seconds since boot; None where it holds
    none (not Linux, a supervisor of an older version, read while being written) or none to believe: the file sits
    in the attempt's work dir, where the job itself could write, so only its first bytes are read and only a moment
    between the supervisor's start and now is taken (never a NaN or a future that would make every later process
    of its group the job's)."""
    try:
        with open(path, "rb") as f:
            moment = float(f.read(HEARTBEAT_BYTES))
    except (OSError, ValueError):
        return None
    now = now_since_boot()
    return moment if now is not None and 0.0 <= moment <= now else None


def attempt_processes(record: dict, *, marker: str, until: float | None, until_since_boot: float | None = None,
                      exclude: Iterable[int] = ()) -> list[psutil.Process]:
    """The live processes of the attempt whose supervisor `record` (`identity`) describes.

    `marker`: the attempt's output directory. `until`: the latest start time a process found by its
    group or session alone may have (None while the supervisor is alive); `until_since_boot` the same in seconds
    since boot, which is what is compared where it and the process's start since boot are known (a step of the
    wall clock since the supervisor died moves every `create_time` psutil reads, never the start since boot).
    None of a record of an earlier boot.
    """
    if not this_boot(record.get("boot_id")):
        return []
    pid, skip = record["pid"], set(exclude)
    found = []
    for proc in psutil.process_iter(["create_time", "status"]):
        started = proc.info["create_time"]
        if (proc.pid in skip or started is None or proc.info["status"] == psutil.STATUS_ZOMBIE
                or _started_before(proc, record)):
            continue
        try:
            if _started_by(proc, until, until_since_boot) and pid in (os.getpgid(proc.pid), os.getsid(proc.pid)):
                found.append(proc)
            elif proc.environ().get(OUTPUT_DIR) == marker:
                found.append(proc)
        except (OSError, psutil.Error):  # gone meanwhile, or not ours to read
            continue
    return found


def _started_by(proc: psutil.Process, until: float | None, until_since_boot: float | None) -> bool:
    if until is None:
        return True
    if until_since_boot is not None and (since_boot := started_since_boot(proc.pid)) is not None:
        return since_boot <= until_since_boot
    return proc.info["create_time"] <= until


def stop(procs: list[psutil.Process], *, grace: float, interrupted: Callable[[], bool] = lambda: False) -> float:
    """SIGTERM, up to `grace` seconds to exit (cut short when `interrupted()`), then SIGKILL; returns when
    the last one was gone (or `KILL_WAIT_S` after the SIGKILL, for a process that cannot die at once)."""
    if grace > 0:
        _send(procs, signal.SIGTERM)
        deadline = time.time() + grace
        while (procs := _alive(procs)) and time.time() < deadline and not interrupted():
            time.sleep(POLL_S)
    _send(procs, signal.SIGKILL)
    deadline = time.time() + KILL_WAIT_S
    while _alive(procs) and time.time() < deadline:
        time.sleep(POLL_S)
    return time.time()


def _send(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        try:
            proc.send_signal(sig)  # checks the pid still names the same process first
        except psutil.Error:
            pass


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running; a zombie is dead (its parent, often init in a container, may never reap it)."""
    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.Error:
            continue
    return out
