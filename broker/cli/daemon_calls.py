"""The job commands' calls when a daemon runs: requests to its API, and reads of the state it keeps.

The counterpart of `calls.py` (the same functions, the same results: the job read from the store, with a
`Settled` for the renderers), but nothing here advances a job: the daemon's reconciler does that.
A followed log is read from the API chunk by chunk until the job ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from trainmaster.broker.cli.daemon_client import Daemon

POLL_S = 0.3


def _settled():
    from trainmaster.broker import paths
    from trainmaster.broker.cli.settled import Settled
    from trainmaster.broker.store import Store

    return Settled(Store(paths.state_db()))


def _ended(state: str) -> bool:
    from trainmaster.broker import states

    return state in states.JOB_ENDS | states.WAITING


def _policy(policy: str) -> str:
    """A policy file is named by its absolute path, resolved here, in the caller's folder (the daemon runs
    elsewhere, and never looks in its own); a policy name as it is (broker/planning/policy.py `names_a_file`)."""
    from trainmaster.jobs.userfile import is_regular_file

    if "/" in policy or policy.endswith((".yaml", ".yml")) or is_regular_file(policy):
        return str(Path(policy).absolute())
    return policy


def submit(daemon: Daemon, spec: Path, policy: str, *, wait: bool, on_submitted: Callable,
           on_log: Callable[[str], None] | None):
    from trainmaster.broker.cli.settled import left_out

    answer = daemon.call("POST", "/v1/jobs", {"spec": str(spec.absolute()), "policy": _policy(policy)})
    settled = _settled()
    on_submitted(settled.store.job(answer["id"]), left_out(settled, answer["id"]))
    return settled, _waited(daemon, settled, answer["id"], wait, on_log)


def _waited(daemon: Daemon, settled, job_id: str, wait: bool, on_log: Callable[[str], None] | None):
    if wait and on_log is not None:
        follow(daemon, job_id, on_log)
    while wait and not _ended(daemon.call("GET", f"/v1/jobs/{job_id}")["state"]):
        time.sleep(POLL_S)
    return settled.store.job(job_id)


def follow(daemon: Daemon, job_id: str, on_log: Callable[[str], None], *, until_end: bool = True) -> None:
    """The latest attempt's log to `on_log`; with `until_end`, until the job has ended and its log is read."""
    attempt, offset = "", 0
    while True:
        chunk = daemon.call("GET", f"/v1/jobs/{job_id}/logs?attempt={attempt or ''}&offset={offset}")
        attempt, offset = chunk["attempt"] or "", chunk["next_offset"]
        if chunk["text"]:
            on_log(chunk["text"])
            continue
        if not until_end or (_ended(chunk["state"]) and (chunk["complete"] or not attempt)):
            return
        time.sleep(POLL_S)


def logs(daemon: Daemon, job_ref: str, *, follow_: bool, on_log: Callable[[str], None]) -> None:
    job_id = daemon.call("GET", f"/v1/jobs/{job_ref}")["id"]
    follow(daemon, job_id, on_log, until_end=follow_)


def cancel(daemon: Daemon, job_ref: str):
    settled = _settled()
    return settled, settled.store.job(daemon.call("POST", f"/v1/jobs/{job_ref}/cancel")["id"])


def resume(daemon: Daemon, job_ref: str, *, wait: bool, max_hours: float | None, max_usd: str | None,
           on_resumed: Callable, on_log: Callable[[str], None] | None):
    from trainmaster.broker.resume_point import ResumePoint

    answer = daemon.call("POST", f"/v1/jobs/{job_ref}/resume", {"max_hours": max_hours, "max_usd": max_usd})
    settled = _settled()
    on_resumed(settled.store.job(answer["id"]), ResumePoint(**answer["resume_point"]))
    return settled, _waited(daemon, settled, answer["id"], wait, on_log)
