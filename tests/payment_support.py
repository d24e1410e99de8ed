"""A `PaymentSender` for tests: each transfer is a line in a file (fsynced), found again by its key.

It stands in for the TAO transfer of issue #17: the tests count its lines to prove a payment went out
exactly once, and `die_after_send` ends the process (as kill -9 would) right after a transfer is made,
before the broker could record it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from trainmaster.wallet.payments import Payment


class FileSender:
    def __init__(self, path: Path, *, die_after_send: bool = False):
        self.path, self.die_after_send = Path(path), die_after_send

    def transfers(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]

    async def sent(self, key: str) -> str | None:
        return next((t["transfer"] for t in self.transfers() if t["key"] == key), None)

    async def send(self, payment: Payment) -> str:
        transfer = f"tx-{len(self.transfers()) + 1}"
        line = json.dumps({"key": payment.key, "payee": payment.payee, "rao": payment.rao, "transfer": transfer})
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self.die_after_send:
            os._exit(9)
        return transfer
