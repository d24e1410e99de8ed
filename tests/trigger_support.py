"""The trigger tests' side of the broker: a submit that records a job per idempotency key in the real store
(as the broker's adapter does), and the test-side runner that ends those jobs when the test says."""

from __future__ import annotations

from pathlib import Path

from trainmaster.broker.daemon.triggers.model import Trigger
from trainmaster.broker.daemon.triggers.submitting import job_for_key
from trainmaster.broker.store import Store

TO_ACCEPTED = ["planned", "dispatched", "running", "returned", "verifying", "accepted"]


class Crash(BaseException):
    """What a kill -9 looks like from inside the process: nothing after it runs."""


class Jobs:
    """Submits record a job (once per key) in the store; `end` walks one to accepted, failed or cancelled."""

    def __init__(self, store_path: Path):
        self.store = Store(store_path)
        self.calls: list[tuple[str, str, str]] = []
        self.crash_before = self.crash_after = False

    async def submit(self, spec_path: Path, policy: str, reason: str, key: str) -> str:
        self.calls.append((str(spec_path), policy, key))
        if self.crash_before:
            raise Crash()
        made = job_for_key(self.store, key)
        if made is None:
            made = f"job-{len(self.store.jobs(limit=10_000)) + 1}"
            self.store.create_job(job_id=made, name="t", workload="dev", project=None, spec_json="{}",
                                  spec_path=str(spec_path), bundle_sha256="0" * 64, policy=policy, policy_json="{}",
                                  detail={"origin": {"trigger_key": key, "reason": reason}})
        if self.crash_after:
            raise Crash()
        return made

    def end(self, job_id: str, state: str = "accepted") -> None:
        for target in (TO_ACCEPTED if state == "accepted" else [state]):
            self.store.move_job(job_id, target)

    def all(self) -> list[str]:
        return sorted(j.id for j in self.store.jobs(limit=10_000))


def trigger(name: str = "t", **fields) -> Trigger:
    return Trigger(name=name, spec=Path("/specs/job.yaml"), **fields)
