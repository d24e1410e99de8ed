"""`JobClient`: the one interface the job commands call, with a local and a daemon implementation.

Every call returns what its command prints: (a view whose `.store` the renderers read, the job or jobs);
output that must appear while the call runs (a streamed log) goes through a callback. `client()` picks the
implementation once per command: the daemon's (broker/cli/daemon_jobs.py) when this home's daemon runs,
else the local one (broker/cli/local_jobs.py). Reads (`status`, `list_jobs`, `logs` without `follow`) never
advance a job in either: the daemon advances its jobs, and the local client starts the bounded background
pass (broker/cli/background.py) instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol


class JobClient(Protocol):
    def submit(self, spec: Path, policy: str, *, wait: bool, on_submitted: Callable,
               on_log: Callable[[str], None] | None, shown: Callable | None = None) -> tuple[Any, Any]:
        """Record and start the job; `on_submitted(job, left_out)` once recorded; with `wait`, until it ends."""

    def status(self, job_ref: str) -> tuple[Any, Any]:
        """The job as recorded (a read: nothing is advanced)."""

    def list_jobs(self, states: set[str] | None, limit: int, ended_since: float | None) -> tuple[Any, list]:
        """The jobs as recorded, newest first (a read)."""

    def logs(self, job_ref: str, *, follow: bool, on_log: Callable[[str], None], shown: Callable | None = None) -> None:
        """The latest attempt's log to `on_log`; with `follow`, until the job ends."""

    def cancel(self, job_ref: str) -> tuple[Any, Any]:
        """Stop the job and record its cost so far."""

    def resume(self, job_ref: str, *, wait: bool, max_hours: float | None, max_usd: str | None,
               on_resumed: Callable, on_log: Callable[[str], None] | None,
               shown: Callable | None = None) -> tuple[Any, Any]:
        """Start a failed or cancelled job again; `on_resumed(job, point)` once started; with `wait`, until it ends."""

    def verify_again(self, job_ref: str) -> tuple[Any, Any]:
        """Run the checks again on the job's unverified attempt."""


def client(*, reading: bool = False) -> JobClient:
    """The daemon's client when this home's daemon runs, else the local one. A read (`reading`) only checks that the
    daemon's process lives (no request: the state is read from the store either way); any other call asks the
    daemon's health too (broker/cli/daemon_client.py `running`)."""
    if reading:
        from trainmaster.broker.cli.reads import daemon_runs

        if daemon_runs():
            from trainmaster.broker.cli.daemon_jobs import DaemonJobClient

            return DaemonJobClient(None)
    else:
        from trainmaster.broker.cli.daemon_client import running

        if daemon := running():
            from trainmaster.broker.cli.daemon_jobs import DaemonJobClient

            return DaemonJobClient(daemon)
    from trainmaster.broker.cli.local_jobs import LocalJobClient

    return LocalJobClient()
