"""Who is who in a refereed pair (docs/protocol.md §3c): the two attempts of one job that share `referee_pair`.

The pair's **lead** is its lowest-numbered attempt that has not ended: the job's state moves with it (dispatched,
running, returned, verifying, …) and its outputs are the ones fetched and judged. The other, its **partner**,
runs beside it and never moves the job: it waits `returned` once its run ended, until the referee has compared the
two. When the lead ends first (it failed, or the referee refuted it), the partner becomes the lead.
"""

from __future__ import annotations

from trainmaster.broker import states
from trainmaster.broker.store import Attempt, Store


def members(store: Store, attempt: Attempt) -> list[Attempt]:
    """The attempts of `attempt`'s pair, as recorded now, by number (just it when it runs alone)."""
    if not attempt.referee_pair:
        return [store.attempt(attempt.id)]
    return [a for a in store.attempts(attempt.job_id) if a.referee_pair == attempt.referee_pair]


def other(store: Store, attempt: Attempt) -> Attempt | None:
    """The other attempt of `attempt`'s pair, as recorded now; None when it runs alone (or its partner was never
    started)."""
    return next((a for a in members(store, attempt) if a.id != attempt.id), None)


def partner_alive(store: Store, attempt: Attempt) -> bool:
    """Whether the other attempt of the pair has not ended: what stops `attempt` ends it alone, not the job."""
    found = other(store, attempt)
    return found is not None and found.state not in states.ATTEMPT_ENDS


def waits_behind(store: Store, attempt: Attempt) -> bool:
    """Whether `attempt` is a partner: a lower-numbered attempt of its pair has not ended, so that one leads."""
    return any(a.n < attempt.n and a.state not in states.ATTEMPT_ENDS for a in members(store, attempt))
