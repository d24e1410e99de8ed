"""The terms of a signed quote, which the miner holds an attempt to: a quote buys one dispatch (a second attempt on
it is refused, miner.db remembers across restarts), and its `hours` are the most the run may take.

The hours are enforced by the local backend's own time limit (its supervisor stops the job even while the miner is
down): the attempt runs with a copy of the spec whose `limits.max_hours` is at most the quoted hours; the bundle and
the spec it was built with are unchanged. A run that the quoted hours stopped says so in its status."""

from __future__ import annotations

from trainmaster.backends.base import AttemptStatus
from trainmaster.backends.bittensor.protocol import Quote
from trainmaster.jobs.spec import JobSpec

TIMED_OUT = 124
"""The exit code the local supervisor records for a run it stopped at its time limit."""
TIME_LIMIT_REASON = "time limit reached"


def held_to(spec: JobSpec, quote: Quote) -> JobSpec:
    """`spec` as it runs here: its wall-clock limit at most the quoted hours."""
    hours = min(spec.limits.max_hours or quote.hours, quote.hours)
    return spec.model_copy(update={"limits": spec.limits.model_copy(update={"max_hours": hours})})


def told(status: AttemptStatus, quote: Quote) -> AttemptStatus:
    """The local backend's status, with the reason "ran past the quoted N h" when the quoted hours stopped the run
    (its own tighter limits.max_hours would have stopped it sooner, and is left as the local backend says)."""
    stopped = status.exit_code == TIMED_OUT and (status.reason or "").startswith(TIME_LIMIT_REASON)
    if not stopped or status.started_at is None or status.ended_at is None:
        return status
    if status.ended_at - status.started_at < quote.hours * 3600:
        return status
    return status.model_copy(update={"reason": f"ran past the quoted {quote.hours:g} h"})
