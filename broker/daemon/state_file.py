"""The daemon's state file, `<home>/daemon/state.json`: its pid, API address and start time.

Written once the API listens and removed at a graceful stop; a daemon killed with -9 leaves it
behind, so a reader checks that the pid still lives (and the CLI also asks the API's health).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from trainmaster.broker.daemon.token import daemon_dir


@dataclass(frozen=True)
class DaemonState:
    pid: int
    address: str
    """`http://127.0.0.1:PORT`, or `unix:/path/to/socket`."""
    started_at: float


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
    return state if _alive(state.pid) else None


def remove(pid: int) -> None:
    """Remove the state file if it is this process's."""
    try:
        if json.loads(state_file().read_text()).get("pid") == pid:
            state_file().unlink()
    except (OSError, ValueError):
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
