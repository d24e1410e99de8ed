"""What an attempt is shown as (`status`, `ls`, the dashboard): its cost to the user and its times, in our words.

An executor we do not control is paid only for accepted work, so an untrusted attempt that was rejected, failed
or cancelled cost nothing, whatever price was recorded for it (the ledger and `spend` agree). And its own
`started_at` and `ended_at` are only what it claims (a proxy may move them by days): the times shown are the
broker's, when it saw the attempt start running and when it saw it end; the claims are kept apart.
"""

from __future__ import annotations

from trainmaster.broker.store import Attempt, Event

STARTED = ("running",)
ENDED = ("returned", "accepted", "rejected", "failed", "cancelled")


def untrusted(attempt: Attempt) -> bool:
    return attempt.executor_hotkey is not None


def cost(attempt: Attempt) -> int:
    """The attempt's cost to the user in micro-USD (0 for an untrusted executor's work that was not accepted)."""
    if untrusted(attempt) and attempt.state != "accepted":
        return 0
    return attempt.cost_micro_usd or 0


def times(attempt: Attempt, events: list[Event]) -> tuple[float | None, float | None]:
    """(started, ended) as shown: the executor's own for compute we trust, else when the broker saw them."""
    if not untrusted(attempt):
        return attempt.started_at, attempt.ended_at
    mine = [e for e in events if e.attempt_id == attempt.id and e.kind == "attempt"]
    started = next((e.at for e in mine if e.to_state in STARTED), None)
    ended = next((e.at for e in mine if e.to_state in ENDED), None)
    return started or (attempt.created_at if ended else None), ended
