"""Which `PaymentSender` settles untrusted attempts: backends.yaml's `bittensor.payments` names it.

`receipt` (the default) moves no money of its own (wallet/payments.py `ConclusionChannel`); `tao` pays
through the chain from the configured wallet's coldkey, exactly once (wallet/tao.py). The coldkey is
unlocked only when a payment is sent: its password comes from `bittensor.coldkey_password_file`, or is
asked at the broker's terminal when it has one.
"""

from __future__ import annotations

import sqlite3
import sys

from trainmaster.wallet.payments import ConclusionChannel, PaymentSender


def configured_sender(configs: dict, db: sqlite3.Connection) -> PaymentSender:
    """The sender backends.yaml asks for, on the broker's connection."""
    config = configs.get("bittensor")
    if config is None or getattr(config, "payments", "receipt") != "tao":
        return ConclusionChannel()
    from trainmaster.wallet import tao_wallet
    from trainmaster.wallet.chain import Chain
    from trainmaster.wallet.tao import TaoSender

    wallet = config.wallet

    def coldkey():
        password = tao_wallet.coldkey_password(wallet.name, wallet.path, password_file=config.coldkey_password_file,
                                               prompt=sys.stdin.isatty())
        return tao_wallet.unlock_coldkey(wallet.name, wallet.path, password=password)

    return TaoSender(db, chain=lambda: Chain.open(config.network), coldkey=coldkey)
