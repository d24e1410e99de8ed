"""Budgets wait instead of failing when only reservations stand in the way.

A hard budget counts what is spent and what open reservations hold (wallet/ledger.py), so concurrent dispatches
never overshoot it together. When a job's reservation would overshoot it, there are two cases:

- the spend alone leaves no room (spent + this job's estimate > cap): nothing that settles this period can make
  room, and the job fails, `refused by budget: …`, as before;
- other jobs' open reservations are what stand in the way: they settle when those runs end (charged what they
  cost, usually less than reserved, or released), so the job waits `queued` with the reason
  (`waiting for budget: …`) and holds no place in the machine's queue; each pass looks again, and it is
  dispatched once the room is there (or fails, if by then the spend alone leaves none).

The look is made before the machine is claimed (`Ledger.refusal`, a preview), and the reservation checks again in
its own transaction; a reservation refused there gives the claim back and waits the same way.
"""

from __future__ import annotations

from trainmaster.wallet.ledger import BudgetExceeded

WAITING = "waiting for budget"
REFUSED = "refused by budget"


def waits(refused: BudgetExceeded) -> bool:
    """Whether a job refused so waits (reservations stand in the way) rather than fails (the spend does)."""
    return not refused.by_spend


def reason(refused: BudgetExceeded) -> str:
    """The job's reason: why it waits, or why it failed."""
    if waits(refused):
        return (f"{WAITING}: {refused} — the open reservations of other runs hold the room; "
                "it starts when they settle")
    return f"{REFUSED}: {refused}"
