"""Payments recorded with their charge, sent once and reconciled before a resend; the broker's key;
the price agreed at dispatch (wallet/payments.py, wallet/keys.py, broker/money/executor_price.py, broker/money/settlement.py)."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from trainmaster.backends.base import Offer
from trainmaster.broker.money.executor_price import agreed
from trainmaster.broker.money.settlement import Settlement
from trainmaster.wallet.keys import BrokerKeyError, broker_key, signed_by
from trainmaster.wallet.ledger import Ledger
from trainmaster.wallet.payments import ConclusionChannel, PaymentOrder, Payments

ORDER = PaymentOrder(attempt_id="j1.1", payee="5Hotkey", rao=2_000_000)


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "state.db") as opened:
        opened.reserve("r1", job_id="j1", backend="bittensor", workload="w", micro_usd=900_000, rao=2_000_000,
                       rate_micro_usd_per_tao=400_000_000)
        yield opened


def _charge(ledger, payment=ORDER, key="charge:j1.1"):
    return ledger.charge(key, reservation_key="r1", micro_usd=800_000, rao=2_000_000,
                         rate_micro_usd_per_tao=400_000_000, payment=payment)


def test_a_charge_writes_its_payment_once_keyed_by_it(ledger):
    _charge(ledger)
    _charge(ledger)  # a retry: the charge and its payment are found, not written again
    [payment] = Payments(ledger.db).all()
    assert (payment.key, payment.charge_key, payment.payee, payment.rao) == ("pay:charge:j1.1", "charge:j1.1", "5Hotkey", 2_000_000)
    assert payment.sent_at is None and payment.transfer is None


def test_a_payment_that_cannot_be_written_takes_its_charge_with_it(ledger):
    with ledger._tx() as db:  # a payment for the attempt exists already (a bug): the charge must not land alone
        db.execute("INSERT INTO payments (key, charge_key, job_id, attempt_id, payee, rao, created_at)"
                   " VALUES ('pay:other', 'other', 'j1', 'j1.1', 'x', 1, 0)")
    with pytest.raises(sqlite3.IntegrityError):
        _charge(ledger)
    assert [e.kind for e in ledger.entries()] == ["reserve"]


def test_a_sent_payment_is_recorded_once_and_never_changed(ledger):
    _charge(ledger)
    payments = Payments(ledger.db)
    assert payments.mark_sent("pay:charge:j1.1", "tx-1").transfer == "tx-1"
    assert payments.mark_sent("pay:charge:j1.1", "tx-1").transfer == "tx-1"
    with pytest.raises(RuntimeError, match="already sent as 'tx-1'"):
        payments.mark_sent("pay:charge:j1.1", "tx-2")
    with pytest.raises(sqlite3.IntegrityError, match="never changed"):
        ledger.db.execute("UPDATE payments SET rao = 0")


class Sender:
    def __init__(self, already: str | None):
        self.already, self.sends = already, []

    async def sent(self, key):
        return self.already

    async def send(self, payment):
        self.sends.append(payment.key)
        return "tx-new"


@pytest.mark.parametrize("already, sends, transfer", [(None, ["pay:charge:j1.1"], "tx-new"), ("tx-old", [], "tx-old")])
def test_the_sender_is_asked_before_any_send(ledger, tmp_path, already, sends, transfer):
    """A payment whose transfer went out before the process died is recorded as sent, never sent again."""
    _charge(ledger)
    sender = Sender(already)
    settlement = Settlement(ledger.db, tmp_path / "state.db", key_path=tmp_path / "broker.key", sender=sender)
    payment = asyncio.run(settlement._sent(Payments(ledger.db).for_attempt("j1.1")))
    assert (sender.sends, payment.transfer) == (sends, transfer)
    asyncio.run(settlement._sent(payment))  # sent: nothing more happens
    assert sender.sends == sends


def test_the_default_channel_moves_no_money_of_its_own(ledger):
    _charge(ledger)
    channel = ConclusionChannel()
    payment = Payments(ledger.db).for_attempt("j1.1")
    assert asyncio.run(channel.sent(payment.key)) is None
    assert asyncio.run(channel.send(payment)) == "receipt:pay:charge:j1.1"


def test_the_broker_key_is_made_once_readable_by_its_owner_only(tmp_path):
    path = tmp_path / "keys" / "broker.key"
    key = broker_key(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert broker_key(path).ss58 == key.ss58  # the same key every time
    signature = key.sign(b"receipt")
    assert signed_by(b"receipt", signature, key.ss58)
    assert not signed_by(b"receipt!", signature, key.ss58)
    assert not signed_by(b"receipt", "0xnot-hex", key.ss58)
    assert not signed_by(b"receipt", signature, "not an address")
    path.chmod(0o644)
    with pytest.raises(BrokerKeyError, match="readable by others"):
        broker_key(path)
    path.chmod(0o600)
    path.write_text("short")
    with pytest.raises(BrokerKeyError, match="32-byte hex seed"):
        broker_key(path)


def _offer(**prices) -> Offer:
    return Offer(backend="bittensor", instance="5Hotkey", **prices)


def test_the_agreed_price_is_the_offers_rate_for_the_planned_hours():
    price = agreed(_offer(price_per_hour_micro_usd=800_000_000, price_per_hour_rao=2_000_000_000), 0.001)
    assert (price.rao, price.rate_micro_usd_per_tao, price.micro_usd) == (2_000_000, 400_000_000, 800_000)
    assert price.capped(900_000) == price
    capped = price.capped(400_000)  # never more than the reservation, the rao scaled at the same rate
    assert (capped.micro_usd, capped.rao) == (400_000, 1_000_000)
    cost = capped.cost(rate_at=123.0)
    assert (cost.micro_usd, cost.rao, cost.rate_at, cost.billable_seconds) == (400_000, 1_000_000, 123.0, 3.6)
    in_usd = agreed(_offer(price_per_hour_micro_usd=1_000_000), 2.5)
    assert (in_usd.micro_usd, in_usd.rao, in_usd.rate_micro_usd_per_tao) == (2_500_000, 0, None)
