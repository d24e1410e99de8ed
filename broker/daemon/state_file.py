"""The daemon's state file, `<home>/daemon/state.json`: its pid, API address and start time.

Written once the API listens and removed at a graceful stop; a daemon killed with -9 leaves it
behind, so a reader checks that the pid still lives and is the process that wrote it, by its start since boot
and the boot's id (jobs/process_start.py): a later process given the same pid, in this boot or after a reboot, is not
the daemon, and `daemon stop` must never signal it. The CLI also asks the API's health.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from trainmaster.broker.daemon.token import daemon_dir
from trainmaster.jobs.process_start import boot_id, same_start, started_since_boot, this_boot


@dataclass(frozen=True)
class DaemonState:
    pid: int
    address: str
    """`http://127.0.0.1:PORT`, or `unix:/path/to/socket`."""
    started_at: float
    since_boot: float | None = None
    """The process's start since boot (`started_since_boot`); None in a file an older version wrote."""
    boot_id: str | None = None
    """The boot it started in (`boot_id`); None in a file an older version wrote."""


def state_file() -> Path:
    return daemon_dir() / "state.json"


def write(state: DaemonState) -> None:
    path = state_file()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state)))
    os.replace(tmp, path)


def read() -> DaemonState | None:
    """The state of a daemon whose process still lives; None when there is none (or it died)."""
    try:
        state = DaemonState(**json.loads(state_file().read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return state if _alive(state) else None


def mine(address: str, started_at: float) -> DaemonState:
    """The state this process writes: its pid, start since boot and boot."""
    return DaemonState(os.getpid(), address, started_at, started_since_boot(os.getpid()), boot_id())


def remove(pid: int) -> None:
    """Remove the state file if it is this process's."""
    try:
        if json.loads(state_file().read_text()).get("pid") == pid:
            state_file().unlink()
    except (OSError, ValueError):
        pass


def _alive(state: DaemonState) -> bool:
    """Whether the process that wrote `state` still runs: its pid lives and, where the file records it, started
    when the writer did, in the same boot (a pid is reused once its process is gone, and after a reboot)."""
    if not this_boot(state.boot_id):
        return False
    try:
        os.kill(state.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if state.since_boot is None:
        return True
    now = started_since_boot(state.pid)
    return now is None or same_start(state.since_boot, now)  # None: no /proc to tell by (not Linux)
