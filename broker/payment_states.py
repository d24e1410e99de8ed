"""Where each payment to an untrusted executor stands, for people and scripts (`status`, `spend`, the dashboard).

A payment (wallet/payments.py) is `sent` once its transfer is recorded (`receipt` when the configured sender moves
no money of its own: the amount is in the executor's signed receipt), else `pending`: with the reason of its last
failed try and when it is tried next (wallet/payment_retries.py), or, never tried yet, waiting for the next pass
(the daemon's, or the background pass a read starts: broker/cli/background.py).
Read-only, on the state database's connection; nothing here sends anything.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from trainmaster.jobs.money import RAO_PER_TAO
from trainmaster.storage import statedb
from trainmaster.wallet.payment_retries import read_tries

RECEIPT_PREFIX = "receipt:"


@dataclass(frozen=True)
class PaymentState:
    job_id: str
    attempt_id: str
    payee: str
    rao: int
    state: str
    """sent | receipt | pending"""
    transfer: str | None
    sent_at: float | None
    reason: str | None
    """Why it is pending: its last failed try's error (None while it was never tried)."""
    tries: int
    next_try_at: float | None

    def to_json(self) -> dict:
        return {**asdict(self), "tao": f"{self.rao / RAO_PER_TAO:.9f}"}


def payment_states(db, *, job_id: str | None = None, pending_only: bool = False) -> list[PaymentState]:
    """Every payment (of `job_id` when given), oldest first; only the unsent ones with `pending_only`."""
    if not statedb.table_exists(db, "payments"):
        return []
    from trainmaster.wallet.payments import payment_rows

    rows = payment_rows(db, job_id=job_id, pending_only=pending_only)
    tries = read_tries(db, [row["key"] for row in rows if row["sent_at"] is None])
    out = []
    for row in rows:
        tried = tries.get(row["key"])
        if row["sent_at"] is not None:
            state = "receipt" if (row["transfer"] or "").startswith(RECEIPT_PREFIX) else "sent"
        else:
            state = "pending"
        out.append(PaymentState(job_id=row["job_id"], attempt_id=row["attempt_id"], payee=row["payee"], rao=row["rao"],
                                state=state, transfer=row["transfer"], sent_at=row["sent_at"],
                                reason=tried.reason if tried and state == "pending" else None,
                                tries=tried.tries if tried and state == "pending" else 0,
                                next_try_at=tried.next_try_at if tried and state == "pending" else None))
    return out


BY = "the daemon, or the background pass the next `trainmaster ls`, `status` or `spend` starts"
"""Who sends a pending payment (a read never sends it itself: broker/cli/background.py)."""


def sentence(p: PaymentState, when) -> str:
    """One line on a payment: `when(ts)` formats a time."""
    tao = f"{p.rao / RAO_PER_TAO:,.9f}".rstrip("0").rstrip(".")
    head = f"payment of {tao} TAO to {p.payee}"
    if p.state == "sent":
        return f"{head}: sent ({p.transfer})"
    if p.state == "receipt":
        return f"{head}: in the executor's signed receipt (payments: receipt)"
    if p.reason is None:
        return f"{head}: pending, not sent yet (sent by {BY})"
    return (f"{head}: PENDING, not sent: {p.reason}; tried {p.tries}×, next try after {when(p.next_try_at)} "
            f"(by {BY})")


def unsent_by_group(db, by: str | None) -> dict[str, tuple[int, int]]:
    """group -> (payments, rao) charged but not sent yet, grouped as `Ledger.spend(by)` groups its charges."""
    if not statedb.table_exists(db, "payments"):
        return {}
    from trainmaster.wallet.spend import charge_groups
    from trainmaster.wallet.payments import unsent

    waiting = unsent(db)
    groups = charge_groups(db, [key for key, _ in waiting], by)
    out: dict[str, tuple[int, int]] = {}
    for key, rao in waiting:
        if key in groups:  # a payment is written with its charge: every one has its ledger entry
            count, total = out.get(groups[key], (0, 0))
            out[groups[key]] = (count + 1, total + (rao or 0))
    return out
