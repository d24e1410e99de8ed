"""`DaemonJobClient`: the `JobClient` (broker/cli/job_client.py) of a home whose daemon runs.

Commands become requests to its API (broker/cli/daemon_calls.py); reads come from the store the daemon keeps up to
date, without a request. `verify --again` runs in this process, as it always has (the API has no such call).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the reads need neither (nor typer, which `daemon_client` imports)
    from trainmaster.broker.cli.daemon_client import Daemon


class DaemonJobClient:
    def __init__(self, daemon: Daemon | None):
        self.daemon = daemon
        """None for a client that only reads (`status`, `list_jobs`)."""

    def submit(self, spec: Path, policy: str, *, wait: bool, on_submitted: Callable,
               on_log: Callable[[str], None] | None, shown: Callable | None = None):
        from trainmaster.broker.cli import daemon_calls

        return daemon_calls.submit(self.daemon, spec, policy, wait=wait, on_submitted=on_submitted, on_log=on_log)

    def status(self, job_ref: str):
        from trainmaster.broker.cli.local_jobs import read_status

        return read_status(job_ref, advance=False)

    def list_jobs(self, states: set[str] | None, limit: int, ended_since: float | None):
        from trainmaster.broker.cli.local_jobs import read_jobs

        return read_jobs(states, limit, ended_since, advance=False)

    def logs(self, job_ref: str, *, follow: bool, on_log: Callable[[str], None], shown: Callable | None = None) -> None:
        from trainmaster.broker.cli import daemon_calls

        return daemon_calls.logs(self.daemon, job_ref, follow_=follow, on_log=on_log)

    def cancel(self, job_ref: str):
        from trainmaster.broker.cli import daemon_calls

        return daemon_calls.cancel(self.daemon, job_ref)

    def resume(self, job_ref: str, *, wait: bool, max_hours: float | None, max_usd: str | None,
               on_resumed: Callable, on_log: Callable[[str], None] | None, shown: Callable | None = None):
        from trainmaster.broker.cli import daemon_calls

        return daemon_calls.resume(self.daemon, job_ref, wait=wait, max_hours=max_hours, max_usd=max_usd,
                                   on_resumed=on_resumed, on_log=on_log)

    def verify_again(self, job_ref: str):
        from trainmaster.broker.cli.local_jobs import LocalJobClient

        return LocalJobClient().verify_again(job_ref)
