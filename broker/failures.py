"""Every way an attempt can fail, and the broker's one reaction to each (issue #15 §2).

A failure is a backend's cause (`AttemptStatus.cause`: the script failed, the machine was preempted,
the offer had no capacity, the run was lost, it was cancelled), a typed backend error (`ExecutorFault`,
`CapacityError`, `LocalEnvironmentError`, `TransientBackendError`, or a plain `BackendError`), or the
checks' verdict `rejected`. `reaction` maps it to what the broker does: the state the attempt ends in
(or that it keeps its state and waits), what the job does next, and whether the executor is banned.
What is paid follows from the attempt's end (`Broker._settle_money`): an untrusted executor is paid
only for accepted work; compute we pay for by the hour is charged whatever the end.

The table (docs/architecture.md §2):

| failure                        | attempt        | job                                      | ban |
|--------------------------------|----------------|------------------------------------------|-----|
| cause script_failed            | failed         | failed (no fallback helps)               |     |
| cause preempted, lost          | failed         | same offer while `retries` allow, resumed; then the next offer |  |
| cause capacity, CapacityError  | failed         | the next offer (this one blocked)        |     |
| ConfigurationError             | failed         | the next offer of another backend (this backend blocked for the job: its set-up refuses every offer) | |
| cause cancelled                | cancelled      | cancelled                                |     |
| cause cancelled (untrusted)    | failed         | the next offer (it abandoned the work; it never ends the job) | |
| ExecutorFault (untrusted)      | rejected       | the next offer                           | yes |
| ExecutorFault (trusted)        | failed, after bounded retries | the next offer            |     |
| verdict rejected               | rejected       | the next offer                           | yes |
| LocalEnvironmentError          | keeps its state; an `error` event says what to fix | waits |  |
| TransientBackendError          | keeps its state (each call retried, bounded) | waits; past the class's `unreachable_after_s`: lost, as above | |
| any other BackendError         | failed         | the next offer                           |     |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trainmaster.backends.base import (
    BackendError, CapacityError, Cause, ConfigurationError, ExecutorFault, LocalEnvironmentError,
    TransientBackendError,
)

JobNext = Literal["failed", "fallback", "same_offer", "cancelled", "waits"]


class Waiting(LocalEnvironmentError):
    """An attempt waits on our own side (a full disk): recorded on it as an `error` event saying what to
    fix; raised so a command that follows the job (`submit --wait`) stops and says so."""


REJECTED = "rejected"
"""The checks' verdict on returned work (the audit caught it, or its outputs are unsafe)."""
Failure = Cause | BaseException | type[BaseException] | Literal["rejected"]


@dataclass(frozen=True)
class Reaction:
    name: str
    """Which row of the table (recorded as the attempt's `cause`)."""
    attempt: str | None
    """The state the attempt ends in; None: it keeps its state (waits on us, or is retried later)."""
    job: JobNext
    """What the job does next: ends failed or cancelled, falls back to the next offer (this one blocked),
    starts again on the same offer while the class's `retries` allow (then falls back), or waits."""
    ban: bool = False
    """The executor's hotkey and coldkey are banned across jobs (`trainmaster executors ls`)."""

    @property
    def ends(self) -> bool:
        return self.attempt is not None


SCRIPT_FAILED = Reaction("script_failed", "failed", "failed")
PREEMPTED = Reaction("preempted", "failed", "same_offer")
LOST = Reaction("lost", "failed", "same_offer")
CAPACITY = Reaction("capacity", "failed", "fallback")
MISCONFIGURED = Reaction("misconfigured", "failed", "fallback")
"""The backend's set-up refuses the run (a missing bucket, role or quota): `broker.readiness.blocked_backends`
keeps the whole backend out of the job's later plans, so no other offer of it is tried in a loop."""
CANCELLED = Reaction("cancelled", "cancelled", "cancelled")
ABANDONED = Reaction("abandoned", "failed", "fallback")
"""An untrusted executor that reports its attempt cancelled (we did not ask): it gave the work up, unpaid."""
EXECUTOR_FAULT = Reaction("executor_fault", "rejected", "fallback", ban=True)
CORRUPTED = Reaction("corrupted", "failed", "fallback")
"""Bytes from our own compute that fail their check (after the bounded retries): not an executor's fault."""
VERDICT_REJECTED = Reaction("rejected", "rejected", "fallback", ban=True)
OUR_ENVIRONMENT = Reaction("our_environment", None, "waits")
TRANSIENT = Reaction("transient", None, "waits")
BACKEND_ERROR = Reaction("backend_error", "failed", "fallback")

BY_CAUSE: dict[Cause, Reaction] = {
    Cause.script_failed: SCRIPT_FAILED,
    Cause.preempted: PREEMPTED,
    Cause.lost: LOST,
    Cause.capacity: CAPACITY,
    Cause.cancelled: CANCELLED,
}


def reaction(failure: Failure, *, trusted: bool) -> Reaction:
    """The one reaction to `failure` on an attempt on trusted (ours) or untrusted compute."""
    if isinstance(failure, Cause):
        return ABANDONED if failure is Cause.cancelled and not trusted else BY_CAUSE[failure]
    if failure == REJECTED:
        return VERDICT_REJECTED
    kind = failure if isinstance(failure, type) else type(failure)
    if issubclass(kind, ExecutorFault):
        return CORRUPTED if trusted else EXECUTOR_FAULT
    if issubclass(kind, CapacityError):
        return CAPACITY
    if issubclass(kind, ConfigurationError):
        return MISCONFIGURED
    if issubclass(kind, LocalEnvironmentError):
        return OUR_ENVIRONMENT
    if issubclass(kind, TransientBackendError):
        return TRANSIENT
    if issubclass(kind, BackendError):
        return BACKEND_ERROR
    raise TypeError(f"not a failure the broker classifies: {failure!r}")


def retried_errors(trusted: bool) -> tuple[type[BackendError], ...]:
    """What a call to a backend is retried on (bounded, `backends.retry`): transient errors, and on our
    own compute bytes that fail their check too (a glitch there is nobody's fault; retried, then failed)."""
    return (TransientBackendError, ExecutorFault) if trusted else (TransientBackendError,)


def cause_of(phase_cancelled: bool, cause: Cause | None, exit_code: int | None) -> Cause:
    """The cause of an attempt that ended without succeeding, for a backend that does not say: a
    cancel is a cancel, a vanished process (no exit code) is lost, an exit code is the script's."""
    if cause is not None:
        return cause
    if phase_cancelled:
        return Cause.cancelled
    return Cause.lost if exit_code is None else Cause.script_failed
