"""Budgets: periods, scopes, hard caps under concurrency, and alerts (log line and a real webhook), on SQLite and
PostgreSQL (the `database` fixture)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from datetime import datetime, timezone

import pytest

from trainmaster.storage import statedb
from trainmaster.wallet import outbox
from trainmaster.wallet.budget import Budget, period_start
from trainmaster.wallet.ledger import BudgetExceeded, Ledger

USD = 1_000_000
JAN = datetime(2026, 1, 15, 12, tzinfo=timezone.utc).timestamp()  # a Thursday
FEB = datetime(2026, 2, 3, tzinfo=timezone.utc).timestamp()


def ts(*args) -> float:
    return datetime(*args, tzinfo=timezone.utc).timestamp()


class Clock:
    def __init__(self, at: float = JAN):
        self.at = at

    def __call__(self) -> float:
        return self.at


def reserve(ledger, key, usd, *, backend="aws", workload="retraining", project=None):
    return ledger.reserve(key, job_id=f"job-{key}", backend=backend, workload=workload, project=project,
                          micro_usd=usd * USD)


def test_period_starts_in_utc():
    assert period_start("day", JAN) == ts(2026, 1, 15)
    assert period_start("week", JAN) == ts(2026, 1, 12)  # Monday
    assert period_start("month", JAN) == ts(2026, 1, 1)
    assert period_start("total", JAN) == 0


def test_scope_matching_and_labels():
    budget = Budget(cap=10, backend="aws", workload="retraining")
    assert budget.matches(backend="aws", workload="retraining", project="x")
    assert not budget.matches(backend="gcp", workload="retraining", project=None)
    assert not budget.matches(backend="aws", workload="development", project=None)
    assert budget.label == "month: backend=aws, workload=retraining"
    assert Budget(cap=1, project="p", name="mine").label == "mine"
    assert Budget(cap=1, period="total").label == "total: all spend"


def test_the_refusal_names_budget_cap_spent_reserved_and_request(database):
    ledger = Ledger(database, [Budget(name="aws monthly", cap=100, backend="aws")], clock=Clock(), notify=list)
    reserve(ledger, "a", 30)
    ledger.charge("ca", reservation_key="a", micro_usd=25 * USD)
    reserve(ledger, "b", 60)
    with pytest.raises(BudgetExceeded) as err:
        reserve(ledger, "c", 20)
    assert str(err.value) == (
        "budget 'aws monthly' ($100.00 per month) would be overshot: spent $25.00 + reserved $60.00 + this request "
        "$20.00 = $105.00, over the cap of $100.00"
    )
    assert (err.value.usage.spent_micro_usd, err.value.usage.reserved_micro_usd) == (25 * USD, 60 * USD)
    reserve(ledger, "d", 15)  # exactly at the cap is allowed
    reserve(ledger, "e", 20, backend="gcp")  # another backend is outside this budget
    assert len(ledger.outstanding()) == 3


def test_release_frees_room_and_an_overcharge_blocks_the_next(database):
    ledger = Ledger(database, [Budget(cap=100)], clock=Clock(), notify=list)
    reserve(ledger, "a", 80)
    with pytest.raises(BudgetExceeded):
        reserve(ledger, "b", 30)
    ledger.release("xa", reservation_key="a")
    reserve(ledger, "b", 30)
    ledger.charge("cb", reservation_key="b", micro_usd=95 * USD)  # the money is spent: recorded, not refused
    with pytest.raises(BudgetExceeded, match=r"spent \$95.00 \+ reserved \$0.00"):
        reserve(ledger, "c", 10)


def test_periods_roll_over_but_open_reservations_carry(database):
    clock = Clock(JAN)
    ledger = Ledger(database, [Budget(cap=100, period="month")], clock=clock, notify=list)
    reserve(ledger, "a", 90)
    ledger.charge("ca", reservation_key="a", micro_usd=90 * USD)
    reserve(ledger, "b", 10)  # still open when the month turns
    clock.at = FEB
    with pytest.raises(BudgetExceeded, match=r"spent \$0.00 \+ reserved \$10.00"):
        reserve(ledger, "c", 95)
    reserve(ledger, "c", 90)
    assert ledger.usage(Budget(cap=100, period="total")).spent_micro_usd == 90 * USD


def test_soft_budgets_alert_but_never_refuse(database):
    alerts = []
    ledger = Ledger(database, [Budget(cap=10, hard=False, alert_at_percent=[100])], clock=Clock(),
                    notify=alerts.append)
    reserve(ledger, "a", 50)
    assert [a.percent for a in alerts] == [100]


def test_project_budget(database):
    ledger = Ledger(database, [Budget(cap=10, project="vision")], clock=Clock(), notify=list)
    reserve(ledger, "a", 10, project="vision")
    reserve(ledger, "b", 10, project="speech")
    with pytest.raises(BudgetExceeded, match="budget 'month: project=vision'"):
        reserve(ledger, "c", 1, project="vision")


# --- the hard cap under concurrency ---------------------------------------------------------------

def _submit(path: str, key: str, barrier=None) -> bool:
    """One submission with its own connection; True when admitted."""
    with Ledger(path, [Budget(cap=100)], notify=list) as ledger:
        if barrier is not None:
            barrier.wait()
        try:
            reserve(ledger, key, 10)
            return True
        except BudgetExceeded:
            return False


def test_fifty_concurrent_threads_against_a_cap_for_ten(database):
    path = str(database)
    Ledger(path).close()  # create the tables once, so the race is about the cap only
    barrier = threading.Barrier(50)
    with ThreadPoolExecutor(max_workers=50) as pool:
        admitted = list(pool.map(lambda i: _submit(path, f"t{i}", barrier), range(50)))
    assert sum(admitted) == 10
    with Ledger(path) as ledger:
        assert len(ledger.outstanding()) == 10
        assert ledger.usage(Budget(cap=100)).reserved_micro_usd == 100 * USD


def test_concurrent_processes_against_a_cap_for_ten(database):
    path = str(database)
    Ledger(path).close()
    with ProcessPoolExecutor(max_workers=4) as pool:
        admitted = list(pool.map(_submit, [path] * 40, [f"p{i}" for i in range(40)]))
    assert sum(admitted) == 10


# --- alerts ---------------------------------------------------------------------------------------

def test_each_threshold_alerts_once_per_period(database):
    alerts, clock = [], Clock(JAN)
    budget = Budget(name="b", cap=100, alert_at_percent=[50, 80, 100], hard=False)
    ledger = Ledger(database, [budget], clock=clock, notify=alerts.append)
    reserve(ledger, "a", 40)
    assert alerts == []
    reserve(ledger, "b", 45)  # 85 %: crosses 50 and 80 at once
    assert [a.percent for a in alerts] == [50, 80]
    reserve(ledger, "b", 45)  # a retry fires nothing
    ledger.charge("ca", reservation_key="a", micro_usd=40 * USD)
    assert len(alerts) == 2
    reserve(ledger, "c", 20)
    assert [a.percent for a in alerts] == [50, 80, 100]
    assert alerts[-1].message() == (
        "budget 'b' reached 100% of its cap this month (since 2026-01-01): $105.00 of $100.00 spent or reserved"
    )
    clock.at = FEB  # a new month: the open reservations alone are 65 %
    reserve(ledger, "d", 1)
    assert [a.percent for a in alerts][3:] == [50]


def test_default_notifier_logs_a_line(database, caplog):
    ledger = Ledger(database, [Budget(name="b", cap=10, alert_at_percent=[80])], clock=Clock())
    with caplog.at_level(logging.WARNING, logger="trainmaster.wallet.alerts"):
        reserve(ledger, "a", 9)
    assert caplog.messages == [
        "budget 'b' reached 80% of its cap this month (since 2026-01-01): $9.00 of $10.00 spent or reserved"
    ]


def test_a_charge_above_its_reservation_is_sent_to_the_notifier_after_the_thresholds_it_crossed(database):
    alerts = []
    ledger = Ledger(database, [Budget(name="b", cap=10, alert_at_percent=[100], hard=False)], clock=Clock(),
                    notify=alerts.append)
    reserve(ledger, "a", 4)
    ledger.charge("ca", reservation_key="a", micro_usd=12 * USD)  # metered compute that ran longer than planned
    assert [type(a).__name__ for a in alerts] == ["Alert", "Overrun"]
    assert alerts[-1].message() == "job job-a was charged $12.00, above its reservation of $4.00; it counts against budget 'b'"
    ledger.charge("ca", reservation_key="a", micro_usd=12 * USD)  # a retry sends nothing again
    assert len(alerts) == 2
    ledger.reserve("d", job_id="job-d", backend="aws", workload="retraining", micro_usd=5 * USD)
    ledger.charge("cd", reservation_key="d", micro_usd=5 * USD)  # as reserved: nothing to say
    assert len(alerts) == 2


@pytest.fixture
def webhook_server():
    """A real aiohttp server on 127.0.0.1 in its own thread; yields (url, received bodies, event, statuses).

    Each request is answered with the next of ``statuses`` (append to it), then 200."""
    from aiohttp import web

    received, got, statuses = [], threading.Event(), []
    loop = asyncio.new_event_loop()
    started = threading.Event()
    state = {}

    async def hook(request):
        received.append(await request.json())
        status = statuses.pop(0) if statuses else 200
        if status < 300:
            got.set()
        return web.Response(status=status, text="ok")

    async def start():
        app = web.Application()
        app.router.add_post("/hook", hook)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["runner"], state["port"] = runner, site._server.sockets[0].getsockname()[1]
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    assert started.wait(10)
    yield f"http://127.0.0.1:{state['port']}/hook", received, got, statuses
    asyncio.run_coroutine_threadsafe(state["runner"].cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _pending(where) -> list[tuple]:
    db = statedb.connect(where)
    try:
        return [tuple(row) for row in
                db.execute("SELECT budget, percent, tries FROM ledger_alerts WHERE delivered_at IS NULL").fetchall()]
    finally:
        db.close()


def test_alert_is_posted_to_the_webhook_and_marked_delivered(database, webhook_server):
    url, received, got, _ = webhook_server
    budget = Budget(name="aws", cap=100, backend="aws", alert_at_percent=[80], webhook=url)
    ledger = Ledger(database, [budget], clock=Clock())
    reserve(ledger, "a", 85)
    for thread in ledger.deliveries:
        thread.join(30)
    [body] = received
    assert body["budget"] == "aws" and body["percent"] == 80 and body["used_micro_usd"] == 85 * USD
    assert body["text"].startswith("budget 'aws' reached 80% of its cap") and body["id"] == f"aws|{period_start('month', JAN):.0f}|80"
    assert _pending(database) == []


def test_a_webhook_that_fails_twice_gets_the_alert_on_the_third_try(database, webhook_server):
    url, received, got, statuses = webhook_server
    statuses += [500, 503]
    ledger = Ledger(database, [Budget(name="b", cap=10, alert_at_percent=[50], webhook=url)], clock=Clock())
    reserve(ledger, "a", 6)
    for thread in ledger.deliveries:
        thread.join(30)
    assert len(received) == 3 and received[0] == received[2]  # the same alert, retried
    assert _pending(database) == []


def test_an_unreachable_webhook_is_logged_kept_and_the_money_still_moves(database, caplog):
    budget = Budget(name="b", cap=10, alert_at_percent=[50], webhook="http://127.0.0.1:9/nothing-listens")
    ledger = Ledger(database, [budget], clock=Clock())
    with caplog.at_level(logging.ERROR, logger="trainmaster.wallet.alerts"):
        reserve(ledger, "a", 6)
        for thread in ledger.deliveries:
            thread.join(30)
    assert any("budget alert webhook http://127.0.0.1:9/… failed after 3 tries" in m for m in caplog.messages)
    assert not any("nothing-listens" in m for m in caplog.messages)  # a webhook's path may hold its token
    assert len(ledger.outstanding()) == 1
    assert _pending(database) == [("b", 50, 1)]


def test_an_alert_the_webhook_missed_is_delivered_by_the_next_process(database, webhook_server):
    url, received, got, statuses = webhook_server
    statuses += [503] * outbox.POST_ATTEMPTS  # down while the threshold is crossed
    ledger = Ledger(database, [Budget(name="b", cap=10, alert_at_percent=[50], webhook=url)], clock=Clock())
    reserve(ledger, "a", 6)
    for thread in ledger.deliveries:
        thread.join(30)
    ledger.close()
    assert not got.is_set() and _pending(database) == [("b", 50, 1)]
    # a later, short-lived process (a CLI call) opens the ledger: it delivers before it exits
    code = f"from trainmaster.wallet.ledger import Ledger; Ledger({str(database)!r}).close()"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert got.is_set() and received[-1]["percent"] == 50 and len(received) == outbox.POST_ATTEMPTS + 1
    assert _pending(database) == []


def test_an_alert_is_given_up_after_max_flushes(database, monkeypatch):
    monkeypatch.setattr(outbox, "POST_ATTEMPTS", 1)
    budget = Budget(name="b", cap=10, alert_at_percent=[50], webhook="http://127.0.0.1:9/nothing-listens")
    ledger = Ledger(database, [budget], clock=Clock())
    reserve(ledger, "a", 6)
    for thread in ledger.deliveries:
        thread.join(30)
    for _ in range(outbox.MAX_FLUSHES + 1):
        outbox.flush(database)
    assert _pending(database) == [("b", 50, outbox.MAX_FLUSHES)]
    db = statedb.connect(database)
    assert not outbox.has_pending(db)
    db.close()


def test_a_failing_notifier_never_undoes_a_movement(database, caplog):
    def broken(alert):
        raise RuntimeError("notifier down")

    ledger = Ledger(database, [Budget(cap=10, alert_at_percent=[50])], clock=Clock(), notify=broken)
    with caplog.at_level(logging.ERROR, logger="trainmaster.wallet.ledger"):
        reserve(ledger, "a", 6)
    assert "notifier down" in caplog.text
    assert [(e.key, e.micro_usd) for e in ledger.entries()] == [("a", 6 * USD)]
