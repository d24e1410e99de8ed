"""Every part of the state creates its tables on SQLite and on PostgreSQL (the `database` fixture), reopens
without migrating twice, and keeps its append-only rules (the ledger's and the payments' triggers)."""

from __future__ import annotations

import pytest

from trainmaster.storage import statedb

PARTS = ("schema_version", "ledger_schema", "payments_schema", "verify_schema", "promotion_schema", "trigger_schema",
         "daemon_notify_schema", "daemon_leases_schema", "executors_schema", "tao_transfers_schema", "settlement_schema")


def _open_every_part(where) -> list:
    from trainmaster.broker.daemon.leases import Leases
    from trainmaster.broker.daemon.notifications import Notifications
    from trainmaster.broker.daemon.triggers.records import Records
    from trainmaster.broker.executors import Executors
    from trainmaster.broker.promotion.records import PromotionStore
    from trainmaster.broker.money.settlement import Settlement
    from trainmaster.broker.store import Store
    from trainmaster.verify.commitments import CommitmentStore
    from trainmaster.verify.records import SecretStore, VerdictStore
    from trainmaster.wallet.ledger import Ledger
    from trainmaster.wallet.tao import TaoSender

    store = Store(where)
    Ledger(store.db)
    Executors(store.db)
    TaoSender(store.db, chain=None, coldkey=None)
    Settlement(store.db, where, key_path="/nonexistent/broker.key", sender=None)
    return [store, VerdictStore(where), CommitmentStore(where), SecretStore(where), PromotionStore(where),
            Records(where), Notifications(where), Leases(where)]


def _versions(where) -> dict[str, int]:
    db = statedb.connect(where)
    try:
        return {part: db.execute(f"SELECT version FROM {part}").fetchone()[0] for part in PARTS}
    finally:
        db.close()


def test_every_part_migrates_once(database):
    for opened in _open_every_part(database):
        opened.close()
    first = _versions(database)
    assert all(version >= 1 for version in first.values())
    for opened in _open_every_part(database):  # reopened: nothing is migrated again (a second CREATE would fail)
        opened.close()
    assert _versions(database) == first


def test_sent_payments_and_ledger_entries_are_never_changed(database):
    from trainmaster.wallet import payments
    from trainmaster.wallet.ledger import Ledger

    with Ledger(database) as ledger:
        ledger.reserve("r1", job_id="j", backend="bittensor", workload="retraining", micro_usd=5)
        ledger.charge("c1", reservation_key="r1", micro_usd=5,
                      payment=payments.PaymentOrder(attempt_id="j.1", payee="5Payee", rao=7))
        db = ledger.db
        db.execute("UPDATE payments SET transfer = 'x', sent_at = 1 WHERE key = (SELECT key FROM payments)")
        for statement, refusal in (("UPDATE payments SET rao = 8", "never changed"),
                                   ("DELETE FROM payments", "never deleted"),
                                   ("DELETE FROM ledger_entries", "append-only")):
            with pytest.raises(statedb.IntegrityError, match=refusal):
                db.execute(statement)
        assert db.execute("SELECT rao FROM payments").fetchone()[0] == 7
