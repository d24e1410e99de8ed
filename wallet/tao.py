"""TAO payments: a `PaymentSender` that transfers a payment's rao from the broker's coldkey, exactly once.

A transfer is signed first (wallet/chain.py) and its extrinsic hash, nonce and the blocks it can land in
are recorded (committed) before the signed bytes are submitted. So a process that dies anywhere after
that leaves a record to reconcile by, and `sent(key)` does, before the broker ever sends again:

- the hash is found in a block of its era and took effect → the payment went out: that hash;
- it landed but its dispatch failed (no money moved), or its era ended with the chain's finalized head
  and it is in none of the era's blocks (it can never be included now) → provably not paid: the try
  is closed and a new transfer, with a new nonce, may be made;
- neither yet → it may still land: `send` submits the same signed bytes again (one nonce, so at most
  one of them is ever included), never a second transfer.

The amount is the payment's integer rao (the accepted quote, capped by its reservation when the charge
was made), checked against its ledger charge; it never passes through a float. The coldkey's password
comes from the caller (a file or a prompt), never silently from the environment.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Awaitable, Callable

from trainmaster.storage import statedb
from trainmaster.wallet.chain import Chain, Inclusion, SignedTransfer
from trainmaster.wallet.payments import Payment

MIGRATIONS: list[list[str]] = [
    [  # 1
        """CREATE TABLE tao_transfers (
            payment_key TEXT NOT NULL,
            try INTEGER NOT NULL,
            payee TEXT NOT NULL,
            rao INTEGER NOT NULL CHECK (rao > 0),
            signer TEXT NOT NULL,
            nonce INTEGER NOT NULL,
            extrinsic_hash TEXT NOT NULL UNIQUE,
            extrinsic TEXT NOT NULL,
            first_block INTEGER NOT NULL,
            last_block INTEGER NOT NULL,
            state TEXT NOT NULL CHECK (state IN ('signed', 'included', 'failed', 'dead')),
            block INTEGER,
            detail TEXT,
            created_at REAL NOT NULL,
            settled_at REAL,
            PRIMARY KEY (payment_key, try)
        )""",
        "CREATE UNIQUE INDEX tao_one_open ON tao_transfers(payment_key) WHERE state IN ('signed', 'included')",
    ],
]


class TransferFailed(RuntimeError):
    """The chain took the transfer and its dispatch failed (e.g. too little balance): nothing was paid."""


class TaoSender:
    """Pays through the chain from the coldkey that `coldkey()` unlocks; records in the broker's SQLite file.

    `chain`: opens the SDK adaptor (`Chain.open(network)` in production)."""

    def __init__(self, db: sqlite3.Connection, *, chain: Callable[[], Awaitable[Chain]], coldkey: Callable[[], object]):
        self.db, self._open_chain, self._coldkey = db, chain, coldkey
        self._keypair = None
        with statedb.immediate(db) as tx:
            statedb.migrate(tx, version_table="tao_transfers_schema", migrations=MIGRATIONS, what="the TAO transfers")

    async def sent(self, key: str) -> str | None:
        """The hash of the transfer that paid `key`, reconciled with the chain; None when none did (yet)."""
        row = self._open(key)
        if row is None or row["state"] == "included":
            return row["extrinsic_hash"] if row else None
        chain = await self._open_chain()
        try:
            found = await chain.find(row["extrinsic_hash"], row["first_block"], row["last_block"])
            if found is not None:
                return self._landed(row, found)
            if await chain.finalized() > row["last_block"]:
                self._close(row, "dead", None, "not in any block of its era, which has ended")
            return None
        finally:
            await chain.close()

    async def send(self, payment: Payment) -> str:
        """Transfer `payment.rao` to `payment.payee`: the signed transfer still open for it when there is one
        (the same bytes), else a new one, recorded before it is submitted. Returns its extrinsic hash."""
        self._check_amount(payment)
        chain = await self._open_chain()
        try:
            row = self._open(payment.key)
            if row is not None and row["state"] == "included":
                return row["extrinsic_hash"]
            if row is None:
                transfer = await chain.sign_transfer(self._signer(), payment.payee, payment.rao)
                row = self._record(payment, transfer)
            signed = SignedTransfer(data=bytes.fromhex(row["extrinsic"]), extrinsic_hash=row["extrinsic_hash"],
                                    nonce=row["nonce"], first_block=row["first_block"], last_block=row["last_block"])
            landed = (await chain.submit(signed, self._signer())
                      or await chain.find(row["extrinsic_hash"], row["first_block"], row["last_block"]))
        finally:
            await chain.close()
        if landed is None:
            raise TransferFailed(f"transfer {row['extrinsic_hash']} for payment {payment.key} is not in a block yet; "
                                 "it is reconciled before any resend")
        transfer_hash = self._landed(row, landed)
        if transfer_hash is None:
            raise TransferFailed(f"the transfer for payment {payment.key} failed on chain: {landed.message}")
        return transfer_hash

    def transfers(self, key: str) -> list[sqlite3.Row]:
        """Every try of payment `key`, oldest first."""
        return self.db.execute("SELECT * FROM tao_transfers WHERE payment_key = ? ORDER BY try", (key,)).fetchall()

    def _signer(self):
        if self._keypair is None:
            self._keypair = self._coldkey()
        return self._keypair

    def _check_amount(self, payment: Payment) -> None:
        """The payment's rao is a positive integer and exactly what its ledger charge recorded."""
        if not isinstance(payment.rao, int) or payment.rao <= 0:
            raise ValueError(f"payment {payment.key} has no positive whole rao to send ({payment.rao!r})")
        from trainmaster.wallet.ledger import charged_rao

        charge = charged_rao(self.db, payment.charge_key)
        if charge is None or charge != payment.rao:
            raise ValueError(f"payment {payment.key} of {payment.rao} rao does not match its charge "
                             f"({charge if charge is not None else 'none'} rao); nothing is sent")

    def _open(self, key: str) -> sqlite3.Row | None:
        return self.db.execute("SELECT * FROM tao_transfers WHERE payment_key = ? AND state IN ('signed', 'included')",
                               (key,)).fetchone()

    def _record(self, payment: Payment, transfer: SignedTransfer) -> sqlite3.Row:
        with statedb.immediate(self.db) as db:
            tries = db.execute("SELECT COUNT(*) FROM tao_transfers WHERE payment_key = ?", (payment.key,)).fetchone()[0]
            db.execute(
                "INSERT INTO tao_transfers (payment_key, try, payee, rao, signer, nonce, extrinsic_hash, extrinsic,"
                " first_block, last_block, state, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'signed', ?)",
                (payment.key, tries + 1, payment.payee, payment.rao, self._signer().ss58_address, transfer.nonce,
                 transfer.extrinsic_hash, transfer.data.hex(), transfer.first_block, transfer.last_block, time.time()))
        return self._open(payment.key)

    def _landed(self, row: sqlite3.Row, found: Inclusion) -> str | None:
        """Record where the transfer landed: its hash when it paid, None when its dispatch failed."""
        if found.success:
            self._close(row, "included", found.block, found.block_hash)
            return row["extrinsic_hash"]
        self._close(row, "failed", found.block, found.message)
        return None

    def _close(self, row: sqlite3.Row, state: str, block: int | None, detail: str | None) -> None:
        with statedb.immediate(self.db) as db:
            db.execute("UPDATE tao_transfers SET state = ?, block = ?, detail = ?, settled_at = ?"
                       " WHERE extrinsic_hash = ? AND state = 'signed'",
                       (state, block, detail, time.time(), row["extrinsic_hash"]))
