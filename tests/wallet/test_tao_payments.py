"""TAO payments exactly once (wallet/tao.py over wallet/chain.py), tested at the SDK's chain-access boundary:
only the `bittensor.Substrate` object is a fake (tests/fake_chain.py, its signatures checked against the
SDK's here); the wallet, its coldkey's signatures, the ledger, the payments and the settlement are real."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from fake_chain import FakeSubstrate
from trainmaster.broker.money.settlement import Settlement
from trainmaster.wallet import tao_wallet
from trainmaster.wallet.chain import ERA_PERIOD, Chain
from trainmaster.wallet.ledger import Ledger
from trainmaster.wallet.payments import PaymentOrder, Payments
from trainmaster.wallet.tao import TaoSender, TransferFailed

RAO = 1_234_567_891  # 1.234567891 TAO: a float would not carry it through unchanged
PAYEE = "5FHneW46xGXgs5mUiveU4sbTyGBzmstUspZC92UhjJM694ty"


def test_the_fake_has_the_sdk_signatures():
    """Every chain call the adaptor makes exists on the SDK's Substrate with the fake's parameters."""
    import bittensor

    used = ("connect", "close", "query", "block_number", "finalized_block_number", "block_hash", "compose",
            "account_next_index", "sign_extrinsic", "submit_signed", "find_extrinsic")
    for name in used:
        real, fake = inspect.signature(getattr(bittensor.Substrate, name)), inspect.signature(getattr(FakeSubstrate, name))
        assert [(p.name, p.kind, p.default) for p in real.parameters.values()] == \
               [(p.name, p.kind, p.default) for p in fake.parameters.values()], name
        assert inspect.iscoroutinefunction(getattr(FakeSubstrate, name)) == inspect.iscoroutinefunction(
            getattr(bittensor.RpcSubstrate, name)), name
    source = inspect.getsource(Chain)
    assert all(f"substrate.{name}(" in source for name in used if name != "connect") and "substrate.connect()" in source


@pytest.fixture
def world(tmp_path):
    info, _ = tao_wallet.create("broker", str(tmp_path / "wallets"), "default", password=None)
    chain = FakeSubstrate(free={info.coldkey_ss58: 10 * RAO})
    ledger = Ledger(tmp_path / "state.db")
    ledger.reserve("r1", job_id="j1", backend="bittensor", workload="w", micro_usd=900_000, rao=RAO,
                   rate_micro_usd_per_tao=400_000_000)
    ledger.charge("charge:j1.1", reservation_key="r1", micro_usd=800_000, rao=RAO, rate_micro_usd_per_tao=400_000_000,
                  payment=PaymentOrder(attempt_id="j1.1", payee=PAYEE, rao=RAO))
    yield chain, ledger, tmp_path / "wallets"
    ledger.close()


def _sender(world) -> TaoSender:
    chain, ledger, wallets = world

    async def open_chain():
        return Chain(chain, "test")

    return TaoSender(ledger.db, chain=open_chain,
                     coldkey=lambda: tao_wallet.unlock_coldkey("broker", str(wallets), password=None))


def _settle(world, sender):
    chain, ledger, wallets = world
    settlement = Settlement(ledger.db, wallets.parent / "state.db", key_path=wallets.parent / "broker.key", sender=sender)
    return asyncio.run(settlement._sent(Payments(ledger.db).for_attempt("j1.1")))


def test_pays_the_exact_rao_once(world):
    chain = world[0]
    payment = _settle(world, _sender(world))
    assert chain.paid(PAYEE) == RAO and len(chain.landed) == 1
    assert payment.transfer == chain.landed[0].extrinsic_hash and payment.sent_at is not None
    assert _settle(world, _sender(world)).transfer == payment.transfer  # settled: nothing is asked or sent again
    assert chain.paid(PAYEE) == RAO


def test_a_crash_after_the_submit_reconciles_by_hash_and_never_pays_twice(world):
    chain, ledger, _ = world
    chain.mode = "lose_answer"  # the transfer lands; the process loses the answer before it records it
    with pytest.raises(Exception, match="unreachable"):
        _settle(world, _sender(world))
    assert Payments(ledger.db).for_attempt("j1.1").sent_at is None
    [row] = _sender(world).transfers("pay:charge:j1.1")
    assert row["state"] == "signed" and row["extrinsic_hash"] == chain.landed[0].extrinsic_hash
    chain.mode = "include"
    payment = _settle(world, _sender(world))  # a new sender on the same file: reconciled, not resent
    assert payment.transfer == chain.landed[0].extrinsic_hash
    assert len(chain.landed) == 1 and chain.paid(PAYEE) == RAO


def test_a_transfer_that_never_landed_is_sent_again_exactly_once(world):
    chain, _, _ = world
    chain.mode = "drop"
    with pytest.raises(Exception, match="unreachable"):
        _settle(world, _sender(world))
    assert chain.landed == []
    chain.mode = "include"
    assert asyncio.run(_sender(world).sent("pay:charge:j1.1")) is None  # still in its era: not provably dead
    chain.advance(ERA_PERIOD + 1)  # its era ends: it can never be included now
    payment = _settle(world, _sender(world))
    tries = _sender(world).transfers("pay:charge:j1.1")
    assert [t["state"] for t in tries] == ["dead", "included"] and tries[0]["nonce"] == tries[1]["nonce"]
    assert payment.transfer == tries[1]["extrinsic_hash"] and chain.paid(PAYEE) == RAO and len(chain.landed) == 1
    assert _settle(world, _sender(world)).transfer == payment.transfer and len(chain.landed) == 1


def test_a_resend_within_the_era_submits_the_same_signed_bytes(world):
    chain, _, _ = world
    chain.mode = "drop"
    with pytest.raises(Exception, match="unreachable"):
        _settle(world, _sender(world))
    chain.mode = "include"
    payment = _settle(world, _sender(world))  # not dead yet: the one signed transfer is submitted again
    [row] = _sender(world).transfers("pay:charge:j1.1")
    assert payment.transfer == row["extrinsic_hash"] and chain.paid(PAYEE) == RAO and len(chain.landed) == 1


def test_a_failed_dispatch_pays_nothing_and_says_why(world):
    chain, _, wallets = world
    chain.free.clear()  # the coldkey holds nothing
    with pytest.raises(TransferFailed, match="InsufficientBalance"):
        _settle(world, _sender(world))
    assert chain.paid(PAYEE) == 0
    assert [t["state"] for t in _sender(world).transfers("pay:charge:j1.1")] == ["failed"]


def test_an_amount_other_than_the_charge_is_never_sent(world):
    chain, ledger, _ = world
    payment = Payments(ledger.db).for_attempt("j1.1")
    from dataclasses import replace

    with pytest.raises(ValueError, match="does not match its charge"):
        asyncio.run(_sender(world).send(replace(payment, rao=RAO + 1)))
    assert chain.landed == [] and chain.signed == {}


def test_the_broker_picks_the_tao_sender_from_backends_yaml(world):
    from trainmaster.backends.bittensor.config import BittensorConfig
    from trainmaster.broker.money.payment_sender import configured_sender
    from trainmaster.wallet.payments import ConclusionChannel

    db = world[1].db
    assert BittensorConfig().payments == "receipt"
    assert isinstance(configured_sender({"bittensor": BittensorConfig()}, db), ConclusionChannel)
    assert isinstance(configured_sender({}, db), ConclusionChannel)
    assert isinstance(configured_sender({"bittensor": BittensorConfig(payments="tao")}, db), TaoSender)
    with pytest.raises(ValueError):
        BittensorConfig(payments="cash")
