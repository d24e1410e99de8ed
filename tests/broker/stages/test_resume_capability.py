"""Where a new attempt resumes from: the reference an earlier attempt's backend reports (`last_checkpoint`),
only from a trusted attempt that was not rejected (or an accepted one), only on the same backend, passed
back as it is; the broker opens no folder of the backend's. End to end through the CLI with a remote
executor: tests/e2e/test_remote_harness.py (resume after kill -9)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from trainmaster.backends.base import BackendError, Handle, Offer
from trainmaster.backends.features import CheckpointRef, ResumesFromCheckpoints
from trainmaster.backends.local import LocalBackend
from trainmaster.broker.service import Broker
from trainmaster.broker.stages import resuming
from trainmaster.broker.store import Attempt


class Reporting(ResumesFromCheckpoints):
    """A backend's last_checkpoint: a reference per attempt id, or an error for the ids in `failing`."""

    def __init__(self, refs: dict[str, str], failing: frozenset[str] = frozenset()):
        self.refs, self.failing, self.asked = refs, failing, []

    async def last_checkpoint(self, handle: Handle) -> CheckpointRef | None:
        self.asked.append(handle.attempt_id)
        if handle.attempt_id in self.failing:
            raise BackendError("the executor refused: no such attempt here")
        ref = self.refs.get(handle.attempt_id)
        return CheckpointRef(uri=ref) if ref else None


class _Store:
    def __init__(self, attempts: list[Attempt]):
        self.rows, self.events = attempts, []

    def attempts(self, job_id):
        return self.rows

    def log_event(self, job_id, kind, detail, attempt_id=None):
        self.events.append((kind, detail["message"], attempt_id))


def _attempt(n: int, backend: str, state: str, *, trusted: bool = True) -> Attempt:
    offer = Offer(backend=backend, instance="m", price_per_hour_micro_usd=1, trusted=trusted)
    handle = Handle(backend=backend, attempt_id=f"j.{n}", data={"opaque": n})
    return Attempt(id=f"j.{n}", job_id="j", n=n, backend=backend, offer_json=offer.model_dump_json(),
                   handle_json=handle.model_dump_json(), state=state, reason=None, started_at=None, ended_at=None,
                   cost_micro_usd=None, cost_rao=None, billable_seconds=None, created_at=0.0)


def _resume_point(attempts: list[Attempt], backend) -> tuple[str | None, list]:
    store = _Store(attempts)
    broker = Broker(store=store, backends={})
    ctx = broker.parts.of(SimpleNamespace(id="j"))
    return asyncio.run(resuming.resume_uri(ctx, attempts[-1], backend)), store.events


def test_the_newest_resumable_attempt_on_the_same_backend_gives_its_reference_as_it_is():
    backend = Reporting({"j.1": "s3://bucket/j.1/", "j.2": "miner:7", "j.3": "attempt:j.3"})
    attempts = [_attempt(1, "remote", "failed"), _attempt(2, "other", "failed"),
                _attempt(3, "remote", "rejected"), _attempt(4, "remote", "dispatched")]
    found, events = _resume_point(attempts, backend)
    assert found == "s3://bucket/j.1/"  # not another backend's (2), never a rejected attempt's (3)
    assert backend.asked == ["j.1"] and events == []


def test_an_untrusted_attempts_states_are_resumed_from_only_once_accepted():
    backend = Reporting({"j.1": "attempt:j.1", "j.2": "attempt:j.2"})
    attempts = [_attempt(1, "remote", "accepted", trusted=False), _attempt(2, "remote", "failed", trusted=False),
                _attempt(3, "remote", "dispatched")]
    assert _resume_point(attempts, backend)[0] == "attempt:j.1"
    assert backend.asked == ["j.1"]


def test_a_backend_that_cannot_say_gives_no_resume_point():
    attempts = [_attempt(1, "remote", "failed"), _attempt(2, "remote", "dispatched")]
    assert _resume_point(attempts, object())[0] is None  # no last_checkpoint capability
    backend = Reporting({}, failing=frozenset({"j.1"}))
    found, events = _resume_point(attempts, backend)
    assert found is None  # asked and refused: the attempt starts afresh, and the refusal is recorded
    assert events == [("error", "no resume point from attempt 1: the executor refused: no such attempt here", "j.2")]


def test_the_local_backend_reports_its_checkpoint_folder_once_it_holds_a_segment(tmp_path):
    handle = Handle(backend="local", attempt_id="j.1", data={"workdir": str(tmp_path)})
    local = LocalBackend()
    assert asyncio.run(local.last_checkpoint(handle)) is None  # no folder yet
    (tmp_path / "checkpoints").mkdir()
    assert asyncio.run(local.last_checkpoint(handle)) is None  # an empty one
    (tmp_path / "checkpoints" / "segments").mkdir()
    assert asyncio.run(local.last_checkpoint(handle)) == CheckpointRef(uri=str(tmp_path / "checkpoints"))
