"""Where each payment to an untrusted executor stands, for people and scripts (`status`, `spend`, the dashboard).

A payment (wallet/payments.py) is `sent` once its transfer is recorded (`receipt` when the configured sender moves
no money of its own: the amount is in the executor's signed receipt), else `pending`: with the reason of its last
failed try and when it is tried next (wallet/payment_retries.py), or, never tried yet, waiting for the next command.
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
    sql, args = "SELECT * FROM payments", []
    where = []
    if job_id is not None:
        where.append("job_id = ?")
        args.append(job_id)
    if pending_only:
        where.append("sent_at IS NULL")
    if where:
        sql += " WHERE " + " AND ".join(where)
    rows = db.execute(sql + " ORDER BY created_at", args).fetchall()
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


def sentence(p: PaymentState, when) -> str:
    """One line on a payment: `when(ts)` formats a time."""
    tao = f"{p.rao / RAO_PER_TAO:,.9f}".rstrip("0").rstrip(".")
    head = f"payment of {tao} TAO to {p.payee}"
    if p.state == "sent":
        return f"{head}: sent ({p.transfer})"
    if p.state == "receipt":
        return f"{head}: in the executor's signed receipt (payments: receipt)"
    if p.reason is None:
        return f"{head}: pending, not sent yet (the next trainmaster command sends it)"
    return (f"{head}: PENDING, not sent: {p.reason}; tried {p.tries}×, next try after {when(p.next_try_at)} "
            "(by any trainmaster command, or the daemon)")


def unsent_by_group(db, by: str | None) -> dict[str, tuple[int, int]]:
    """group -> (payments, rao) charged but not sent yet, grouped as `Ledger.spend(by)` groups its charges."""
    if not statedb.table_exists(db, "payments"):
        return {}
    from trainmaster.wallet.ledger import COLUMNS_GROUPED

    group = "'total'" if by is None else ("e." + COLUMNS_GROUPED[by] if by in COLUMNS_GROUPED
                                          else statedb.dialect(db).month("e.at"))
    rows = db.execute(f"SELECT {group} AS g, COUNT(*), SUM(p.rao) FROM payments p JOIN ledger_entries e"
                      " ON e.key = p.charge_key WHERE p.sent_at IS NULL GROUP BY g").fetchall()
    return {row[0]: (row[1], row[2] or 0) for row in rows}
