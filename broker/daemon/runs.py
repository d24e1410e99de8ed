"""Every daemon process of a home, whatever it is doing: `<home>/daemon/run/<pid>.json`.

A daemon writes its file as soon as it starts and updates it at each phase — `starting`, `waiting` (for the
database, saying why), `running` (with its address), `held` (another daemon holds the state: `message` names it),
`failed` (the reason: a configuration file's `file:line` message, a database that never came) — and removes it
when it exits. `daemon start` follows the file of the daemon it started to say what it waits for or why it did
not start; `daemon status` and `daemon stop` find every daemon of the home through these files, not only the
one in `state.json`. A file whose process is gone (a `kill -9`), or whose pid now belongs to another process,
is ignored and removed by the next reader. A run is told from a later process given its pid by its start since
boot (jobs/process_start.py), which a step of the wall clock (NTP, a laptop or a VM resumed) does not move, and by
the boot's id: a file a daemon left before a reboot names no live process.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from trainmaster.broker.daemon.token import daemon_dir
from trainmaster.jobs.process_start import boot_id, same_start, started_since_boot, this_boot

STARTING, WAITING, RUNNING, HELD, FAILED, STOPPING = "starting", "waiting", "running", "held", "failed", "stopping"


@dataclass(frozen=True)
class Run:
    pid: int
    started_at: float
    phase: str
    message: str = ""
    address: str = ""
    since_boot: float | None = None
    """The process's start since boot (Linux); None on macOS and in a file of an older version."""
    boot_id: str | None = None
    """The boot it started in (Linux); None on macOS and in a file of an older version."""


def run_dir() -> Path:
    return daemon_dir() / "run"


def run_file(pid: int) -> Path:
    return run_dir() / f"{pid}.json"


def record(phase: str, message: str = "", address: str = "", *, started_at: float) -> None:
    """This process's phase (atomically replaced)."""
    folder = run_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    run = Run(os.getpid(), started_at, phase, message, address, started_since_boot(os.getpid()), boot_id())
    tmp = folder / f".{os.getpid()}.tmp"
    tmp.write_text(json.dumps(asdict(run)))
    os.replace(tmp, run_file(os.getpid()))


def remove() -> None:
    with contextlib.suppress(OSError):
        run_file(os.getpid()).unlink()


def read(pid: int) -> Run | None:
    """The run of `pid`, live or not (a daemon that failed has written why before it exited)."""
    try:
        return Run(**json.loads(run_file(pid).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def live() -> list[Run]:
    """The daemons of this home whose processes still run, oldest first; stale files are removed."""
    found = []
    try:
        names = sorted(os.listdir(run_dir()))
    except OSError:
        return []
    for name in names:
        if not name.endswith(".json") or not name[:-5].isdigit():
            continue
        run = read(int(name[:-5]))
        if run is not None and alive(run):
            found.append(run)
        elif run is not None and run.phase not in (FAILED, HELD):
            with contextlib.suppress(OSError):
                run_file(run.pid).unlink()
    return sorted(found, key=lambda r: r.started_at)


def alive(run: Run) -> bool:
    """Whether the run's process lives and is the one that wrote it (not a later process given its pid): by its start
    since boot where recorded, exact whatever the clock did since; else by its wall-clock start, which must come
    before the time it recorded; never a run of an earlier boot."""
    if not this_boot(run.boot_id):
        return False
    try:
        import psutil

        proc = psutil.Process(run.pid)
        if run.since_boot is not None and (now := started_since_boot(run.pid)) is not None:
            same = same_start(run.since_boot, now)
        else:
            same = proc.create_time() <= run.started_at + 1.0
        return same and proc.status() != psutil.STATUS_ZOMBIE
    except Exception:  # noqa: BLE001 — gone, or not ours to look at
        return False


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait up to `timeout` for the processes to end; those still running."""
    import psutil

    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if psutil.pid_exists(p) and _not_zombie(p)]
        if left:
            time.sleep(0.1)
    return left


def _not_zombie(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
