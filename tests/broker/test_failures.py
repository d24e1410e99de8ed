"""Every row of the failure reaction table (`broker.failures`) walked through the real Broker, with its
real store and ledger in the test's home and small scripted backends (tests/scripted_backend.py):
what the attempt ends as, what the job does, what the ledger records, which offer is blocked and
who is banned."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from broker_support import SyncBroker
from scripted_backend import Script, Scripted, ScriptedExecutor
from trainmaster.backends.base import (
    AttemptStatus, BackendError, CapacityError, Cause, ExecutorFault, LocalEnvironmentError, Phase,
    TransientBackendError,
)
from trainmaster.backends.retry import ATTEMPTS
from trainmaster.broker import failures
from trainmaster.wallet.ledger import Ledger


def ended(cause: Cause, exit_code: int | None = 1) -> AttemptStatus:
    phase = Phase.cancelled if cause is Cause.cancelled else Phase.failed
    return AttemptStatus(phase=phase, cause=cause, exit_code=exit_code, reason=f"scripted: {cause.value}",
                         started_at=1.0, ended_at=2.0)


@dataclass
class Row:
    id: str
    script: Script
    attempts: list[tuple[str, str]]
    """(backend, state) of each attempt once the job has gone as far as it can."""
    job: str
    settled: list[str]
    """How each attempt's reservation was settled, in order (charge, release; nothing while it waits)."""
    cause: str | None
    """The reaction recorded on the first attempt's end (None: it did not end)."""
    trusted: bool = True
    retries: int = 0
    unreachable_after_s: float = 600
    banned: bool = False
    calls: dict[str, int] = field(default_factory=dict)
    """How many times the primary backend was asked, by call."""


FALLEN_BACK = [("local", "failed"), ("aws", "accepted")]
ROWS = [
    Row("script failed", Script(status=ended(Cause.script_failed)), [("local", "failed")], "failed", ["charge"],
        "script_failed"),
    Row("preempted: same offer while retries allow, then fallback", Script(status=ended(Cause.preempted, None)),
        [("local", "failed"), ("local", "failed"), ("aws", "accepted")], "accepted", ["charge"] * 3, "preempted",
        retries=1),
    Row("lost: same offer while retries allow, then fallback", Script(status=ended(Cause.lost, None)),
        [("local", "failed"), ("local", "failed"), ("aws", "accepted")], "accepted", ["charge"] * 3, "lost", retries=1),
    Row("lost with no retries: fallback", Script(status=ended(Cause.lost, None)), FALLEN_BACK, "accepted",
        ["charge", "charge"], "lost"),
    Row("capacity, reported with an exit code: fallback", Script(status=ended(Cause.capacity, 3)), FALLEN_BACK,
        "accepted", ["charge", "charge"], "capacity"),
    Row("cancelled", Script(status=ended(Cause.cancelled, None)), [("local", "cancelled")], "cancelled", ["charge"],
        "cancelled"),
    Row("an untrusted executor that cancels on its own abandons the work, not the job",
        Script(status=ended(Cause.cancelled, None)), [("bittensor", "failed"), ("aws", "accepted")], "accepted",
        ["release", "charge"], "abandoned", trusted=False),
    Row("CapacityError at submit: fallback", Script(submit=CapacityError("no free GPU")), FALLEN_BACK, "accepted",
        ["release", "charge"], "capacity"),
    Row("any other BackendError at submit: fallback", Script(submit=BackendError("bad request")), FALLEN_BACK,
        "accepted", ["release", "charge"], "backend_error"),
    Row("ExecutorFault from untrusted compute: rejected, banned, unpaid",
        Script(fetch=ExecutorFault("result.txt: sha256 differs from the announced one")),
        [("bittensor", "rejected"), ("aws", "accepted")], "accepted", ["release", "charge"], "executor_fault",
        trusted=False, banned=True, calls={"fetch": 1}),
    Row("ExecutorFault at status from untrusted compute: rejected, banned",
        Script(status=ExecutorFault("the status answer does not parse")),
        [("bittensor", "rejected"), ("aws", "accepted")], "accepted", ["release", "charge"], "executor_fault",
        trusted=False, banned=True),
    Row("altered bytes from our own compute: failed after the bounded retries",
        Script(fetch=ExecutorFault("result.txt: sha256 differs from the announced one")), FALLEN_BACK, "accepted",
        ["charge", "charge"], "corrupted", calls={"fetch": ATTEMPTS}),
    Row("the checks reject untrusted work: rejected, banned, unpaid", Script(),
        [("bittensor", "rejected"), ("aws", "accepted")], "accepted", ["release", "charge"], "rejected",
        trusted=False, banned=True),
    Row("LocalEnvironmentError: the attempt waits and says so", Script(fetch=LocalEnvironmentError("disk full: free 3 MB")),
        [("local", "returned")], "returned", [], None),
    Row("transient errors within the deadline: the attempt keeps its state",
        Script(status=TransientBackendError("connection reset")), [("local", "dispatched")], "dispatched", [], None,
        calls={"status": 2 * ATTEMPTS}),
    Row("unreachable past the deadline: lost, then fallback", Script(status=TransientBackendError("connection reset")),
        FALLEN_BACK, "accepted", ["charge", "charge"], "lost", unreachable_after_s=0),
]


@pytest.fixture
def fast_retries(monkeypatch):
    monkeypatch.setattr("trainmaster.backends.retry.MAX_WAIT_S", 0.01)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_each_failure_gets_its_one_reaction(tm_home, job_factory, tmp_path, fast_retries, row):
    from trainmaster.broker.service import Broker

    primary = Scripted(name="local", script=row.script) if row.trusted else ScriptedExecutor(script=row.script)
    policy = tmp_path / "p.yaml"
    policy.write_text(f"name: p\ndefault:\n  primary: {primary.name}\n  fallbacks: [aws]\n  retries: {row.retries}\n"
                      f"  unreachable_after_s: {row.unreachable_after_s}\n")
    broker = SyncBroker(Broker(backends={primary.name: primary, "aws": Scripted(name="aws", script=Script())}))
    # an untrusted executor is offered only a job that commits to its states (broker/auditability.py): the
    # scripted executor never runs it, so a runtime recipe's entrypoint is enough
    spec = job_factory("print('hi')\n", **({} if row.trusted else {"entrypoint": "python -m trainmaster.jobs.recipes.dqn"}))
    if row.job in ("returned", "dispatched"):  # it waits: each look leaves it where it is
        _waiting(lambda: broker.submit(spec, str(policy)))
        [job] = broker.store.jobs()
        _waiting(lambda: broker.advance(job.id))
    else:
        job = broker.wait(broker.submit(spec, str(policy)).id, timeout_s=60)
    job = broker.store.job(job.id)
    attempts = broker.store.attempts(job.id)
    assert [(a.backend, a.state) for a in attempts] == row.attempts, [a.reason for a in attempts]
    assert job.state == row.job, job.reason
    with Ledger(broker.store.db) as ledger:
        entries = ledger.entries(job_id=job.id)
    settled = {e.reservation_key: e.kind for e in entries if e.kind != "reserve"}
    assert [settled[a.reserve_key] for a in attempts if a.reserve_key in settled] == row.settled
    assert broker.store.violations(job.id) == []
    first_end = [e.detail for e in broker.store.events(job.id) if e.kind == "attempt" and e.attempt_id == attempts[0].id
                 and e.to_state in ("failed", "rejected", "cancelled")]
    assert [d["cause"] for d in first_end] == ([row.cause] if row.cause else [])
    said = {e.kind: e.detail for e in broker.store.events(job.id) if e.kind in ("error", "unreachable")}
    if row.job == "returned":  # what to fix is on the attempt
        assert said["error"]["cause"] == "our_environment" and "disk full" in said["error"]["message"]
    if row.job == "dispatched":
        assert "connection reset" in said["unreachable"]["message"] and attempts[0].unreachable_since is not None
    hotkeys, coldkeys = broker.executors.banned()
    assert bool(hotkeys and coldkeys) == row.banned
    if row.attempts[-1][0] == "aws":  # fell back: the primary's offer is blocked for the job
        assert attempts[0].offer_json and any(k.startswith(f"{primary.name}/") for k in broker.parts.of(job).blocked())
    for call, times in row.calls.items():
        assert row.script.calls.count(call) == times, row.script.calls
    broker.close()


def _waiting(call) -> None:
    """Run `call`; a wait on our side stops it, saying what to fix."""
    try:
        call()
    except failures.Waiting as exc:
        assert "disk full: free 3 MB" in str(exc) and "on our side" in str(exc)


def test_an_unreachable_attempt_records_when_it_was_first_unreachable_and_forgets_it_once_answered(
        tm_home, job_factory, fast_retries):
    from trainmaster.broker.service import Broker

    script = Script(status=TransientBackendError("connection reset"))
    broker = SyncBroker(Broker(backends={"local": Scripted(name="local", script=script)}))
    job = broker.submit(job_factory("print('hi')\n"))
    [attempt] = broker.store.attempts(job.id)
    first = attempt.unreachable_since
    assert first is not None
    broker.advance(job.id)
    assert broker.store.attempt(attempt.id).unreachable_since == first  # the first time is kept
    assert [e.detail["message"] for e in broker.store.events(job.id) if e.kind == "unreachable"] == [
        "asking local for the status: connection reset"]
    script.status = AttemptStatus(phase=Phase.running, started_at=1.0)
    broker.advance(job.id)
    assert broker.store.attempt(attempt.id).unreachable_since is None
    broker.close()


@pytest.mark.parametrize("failure", [*Cause, "rejected", ExecutorFault, CapacityError, LocalEnvironmentError,
                                     TransientBackendError, BackendError])
@pytest.mark.parametrize("trusted", [True, False])
def test_every_failure_maps_to_exactly_one_row(failure, trusted):
    reaction = failures.reaction(failure, trusted=trusted)
    assert reaction in {failures.SCRIPT_FAILED, failures.PREEMPTED, failures.LOST, failures.CAPACITY,
                        failures.CANCELLED, failures.ABANDONED, failures.EXECUTOR_FAULT, failures.CORRUPTED, failures.VERDICT_REJECTED,
                        failures.OUR_ENVIRONMENT, failures.TRANSIENT, failures.BACKEND_ERROR}
    assert reaction.ends == (reaction.job != "waits")
    assert reaction.ban == (reaction.attempt == "rejected")  # only an executor we do not control is banned


def test_an_executors_fault_is_blamed_only_on_compute_we_do_not_control():
    assert failures.reaction(ExecutorFault("x"), trusted=False) is failures.EXECUTOR_FAULT
    assert failures.reaction(ExecutorFault("x"), trusted=True) is failures.CORRUPTED
    with pytest.raises(TypeError):
        failures.reaction(ValueError("not a backend's"), trusted=True)


def test_a_backend_that_failed_every_time_is_priced_as_nearly_sure_to_fail_and_planning_still_works(
        tm_home, job_factory, fast_retries):
    """Found by the cancel property test: five failed attempts of a backend made its failure rate 1.0,
    and every later plan raised ValueError."""
    from trainmaster.broker.service import Broker
    from trainmaster.broker.stages.offer_rounds import MAX_FAILURE_RATE, learned

    broker = SyncBroker(Broker(backends={"local": Scripted(name="local", script=Script(status=ended(Cause.script_failed)))}))
    for _ in range(5):
        broker.wait(broker.submit(job_factory("print(1)\n")).id, timeout_s=60)
    assert learned(broker.store.ended_attempts())[1] == {"local:on-demand": MAX_FAILURE_RATE}
    assert broker.submit(job_factory("print(1)\n")).state == "failed"  # planned and run, not a ValueError
    broker.close()
