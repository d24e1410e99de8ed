"""Settling with an untrusted executor after its verdict, exactly once: pay, then conclude.

The steps, each recorded before the next, each safe to run again after the process dies anywhere:

1. the verdict is stored (verify/records.py); an attempt still `verifying` whose final verdict is
   stored is never verified again (broker/service.py);
2. the charge and its payment are written in one transaction (wallet/ledger.py, wallet/payments.py);
   a rejected attempt's reservation is released and nothing is paid;
3. the payment is sent: the `PaymentSender` is first asked whether the payment with its key already
   went out, and only if not is it sent; then the transfer is recorded. A payment that cannot be sent now
   (the chain unreachable, the coldkey locked, a transfer not in a block yet) is **pending**: the try is
   recorded with its reason and the time of the next one (wallet/payment_retries.py), nothing else is done
   for the attempt until then, and no command fails on it;
4. the receipt (verdict, amount, payment, the challenge digest published at dispatch) is made and
   signed with the broker's key once and stored, so every resend carries the same bytes; the
   challenge secret is revealed, and the executor's idempotent `conclude` is called until its
   countersignature, checked against its hotkey, is stored.

The conclusions live in the broker's SQLite file in their own table, with their own schema version row.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from trainmaster.backends.base import ExecutorFault, Handle
from trainmaster.backends.features import Conclusion, RunsUntrusted
from trainmaster.backends.retry import retried
from trainmaster.broker.store import Attempt, Job
from trainmaster.storage import statedb
from trainmaster.wallet.keys import BrokerKey, broker_key, signed_by
from trainmaster.wallet.payment_retries import PaymentTries
from trainmaster.wallet.payments import Payment, Payments, PaymentSender

SEND_TIMEOUT_S = 60.0
"""At most this long for one try of a payment (a chain that hangs is a try that failed, tried again later)."""
RECEIPT_FORMAT = 1
RECEIPT_KIND = "trainmaster-settlement-receipt"
MIGRATIONS: list[list[str]] = [
    [  # 1
        """CREATE TABLE conclusions (
            attempt_id TEXT PRIMARY KEY,
            job_id TEXT NOT NULL,
            receipt TEXT NOT NULL,
            signature TEXT NOT NULL,
            countersignature TEXT,
            created_at REAL NOT NULL,
            acknowledged_at REAL
        )""",
    ],
]


@dataclass(frozen=True)
class Receipt:
    """A stored receipt: its canonical JSON text, the broker's signature, and the executor's once acknowledged."""

    attempt_id: str
    job_id: str
    receipt: str
    signature: str
    countersignature: str | None
    created_at: float
    acknowledged_at: float | None


class Settlement:
    """The settling stage on the broker's connection: `pending` finds the attempts to settle, `conclude` settles one."""

    def __init__(self, db: sqlite3.Connection, db_path: Path, *, key_path: Path, sender: PaymentSender):
        self.db, self.db_path, self.key_path, self.sender = db, db_path, Path(key_path), sender
        self.payments = Payments(db)
        self._key: BrokerKey | None = None
        with statedb.immediate(db) as tx:
            statedb.migrate(tx, version_table="settlement_schema", migrations=MIGRATIONS, what="the settlements")

    @property
    def key(self) -> BrokerKey:
        """The broker's signing key, made under the home on first use."""
        if self._key is None:
            self._key = broker_key(self.key_path)
        return self._key

    def pending(self, job_id: str | None = None) -> list[tuple[str, str]]:
        """(job id, attempt id) of each untrusted attempt with a final verdict whose executor has not yet
        acknowledged its conclusion."""
        sql = ("SELECT a.job_id, a.id FROM attempts a WHERE a.state IN ('accepted', 'rejected')"
               " AND a.executor_hotkey IS NOT NULL AND NOT EXISTS (SELECT 1 FROM conclusions c"
               " WHERE c.attempt_id = a.id AND c.countersignature IS NOT NULL)")
        args: tuple = ()
        if job_id is not None:
            sql, args = sql + " AND a.job_id = ?", (job_id,)
        return [(row[0], row[1]) for row in self.db.execute(sql + " ORDER BY a.created_at", args).fetchall()]

    def receipt(self, attempt_id: str) -> Receipt | None:
        row = self.db.execute("SELECT * FROM conclusions WHERE attempt_id = ?", (attempt_id,)).fetchone()
        return Receipt(**dict(row)) if row else None

    async def conclude(self, job: Job, attempt: Attempt, backend: RunsUntrusted, handle: Handle, *,
                       amount_rao: int) -> Receipt | None:
        """Send the attempt's payment (if it has one and it did not go out), then deliver its conclusion and
        store the executor's countersignature. `amount_rao`: what its charge paid (0 when rejected).
        None while the payment is pending (not sent now: its try recorded, tried again when due)."""
        payment = self.payments.for_attempt(attempt.id)
        if payment is not None and payment.sent_at is None and not await self._try_to_send(payment):
            return None
        payment = self.payments.for_attempt(attempt.id)
        receipt = self.receipt(attempt.id) or self._issue(job, attempt, payment, amount_rao)
        if receipt.countersignature is not None:
            return receipt
        conclusion = Conclusion(verdict=attempt.state, amount_rao=amount_rao, challenge_secret=self._reveal(job, attempt),
                                receipt=receipt.receipt, signature=receipt.signature, broker=self.key.ss58)
        ack = await retried(backend.conclude, handle, conclusion)
        if not signed_by(receipt.receipt.encode(), ack.countersignature, attempt.executor_hotkey):
            raise ExecutorFault(f"the executor's countersignature of its receipt is not valid for its hotkey "
                                f"{attempt.executor_hotkey}")
        with statedb.immediate(self.db) as db:
            db.execute("UPDATE conclusions SET countersignature = ?, acknowledged_at = ? WHERE attempt_id = ?"
                       " AND countersignature IS NULL", (ack.countersignature, time.time(), attempt.id))
        return self.receipt(attempt.id)

    async def _try_to_send(self, payment: Payment) -> bool:
        """Send `payment` if its retry time has come; whether it is sent. A failure of the sender is a pending
        payment (its reason and next try recorded), never an error of the command that happened to try."""
        tries = PaymentTries(self.db)
        if not tries.due(payment.key):
            return False
        try:
            await asyncio.wait_for(self._sent(payment), SEND_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 — whatever stops a send now is told and tried again later
            reason = str(exc) if not isinstance(exc, TimeoutError) else f"no answer within {SEND_TIMEOUT_S:.0f} s"
            tries.failed(payment.key, reason or type(exc).__name__)
            return False
        return True

    async def _sent(self, payment: Payment | None) -> Payment | None:
        """The payment sent exactly once: reconciled with the sender before any (re)send."""
        if payment is None or payment.sent_at is not None:
            return payment
        transfer = await self.sender.sent(payment.key) or await self.sender.send(payment)
        return self.payments.mark_sent(payment.key, transfer)

    def _issue(self, job: Job, attempt: Attempt, payment: Payment | None, amount_rao: int) -> Receipt:
        """Make, sign and store the attempt's receipt, once (a second process keeps the first one stored)."""
        fields = {
            "format": RECEIPT_FORMAT, "kind": RECEIPT_KIND, "broker": self.key.ss58, "job_id": job.id,
            "attempt_id": attempt.id, "executor": attempt.executor_hotkey, "verdict": attempt.state,
            "amount_rao": amount_rao, "payment": payment.key if payment else None,
            "transfer": payment.transfer if payment else None, "bundle_sha256": job.bundle_sha256,
            "challenge_digest": self._digest(job, attempt), "issued_at": int(time.time()),
        }
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        with statedb.immediate(self.db) as db:
            db.execute("INSERT INTO conclusions (attempt_id, job_id, receipt, signature, created_at)"
                       " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING", (attempt.id, job.id, text, self.key.sign(text.encode()), time.time()))
        return self.receipt(attempt.id)

    def _digest(self, job: Job, attempt: Attempt) -> str:
        from trainmaster.verify.records import SecretStore

        secrets_ = SecretStore(self.db_path)
        try:
            return secrets_.digest(job.id, attempt.id)
        finally:
            secrets_.close()

    def _reveal(self, job: Job, attempt: Attempt) -> str:
        """The attempt's challenge secret (hex): its verdict is stored, so it may now be told."""
        from trainmaster.verify.records import SecretStore

        secrets_ = SecretStore(self.db_path)
        try:
            return secrets_.reveal(job.id, attempt.id).hex()
        finally:
            secrets_.close()
