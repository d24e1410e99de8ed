"""`GET /metrics`: the exposition parsed back with prometheus_client's own parser, against a state database
with known jobs, ledger rows and verdicts (tests/observe_support.py), on SQLite and PostgreSQL."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from observe_support import known_state, serve
from trainmaster.wallet.budget import Budget


def scrape(url: str) -> dict[str, dict[tuple, float]]:
    """{family name: {sorted label items (+ sample name for histograms): value}}."""
    with urllib.request.urlopen(url + "/metrics") as answer:
        assert answer.headers["Content-Type"].startswith("text/plain")
        text = answer.read().decode()
    found: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(family.name, {})[(sample.name, *sorted(sample.labels.items()))] = sample.value
    return found


@pytest.fixture
def known(tmp_path, database):
    """The known state in the home's state.db, then on PostgreSQL (the `database` fixture)."""
    filler = known_state(tmp_path / "home", database if isinstance(database, str) else None)
    yield filler
    filler.close()


def test_jobs_spend_verdicts_and_budgets_are_the_database_s(known):
    budgets = [Budget(cap="10", period="month"), Budget(cap="1", backend="local", period="total")]
    served = serve(known.path, budgets)
    try:
        m = scrape(served.url)
    finally:
        served.stop()
    jobs = {labels[1][1]: v for labels, v in m["trainmaster_jobs"].items()}
    assert jobs["accepted"] == 2 and jobs["failed"] == 1 and jobs["running"] == 1 and jobs["planned"] == 1
    assert jobs["cancelled"] == 0 and set(jobs) >= {"queued", "verifying", "unverified"}  # every state named
    usd = m["trainmaster_spend_usd"]
    assert usd[("trainmaster_spend_usd_total", ("backend", "local"))] == 1.5
    assert usd[("trainmaster_spend_usd_total", ("backend", "bittensor"))] == 0.25
    assert ("trainmaster_spend_usd_total", ("backend", "aws")) not in usd  # held, not charged
    assert m["trainmaster_spend_rao"][("trainmaster_spend_rao_total", ("backend", "bittensor"))] == 5000
    assert m["trainmaster_reserved_usd"] == {("trainmaster_reserved_usd", ("backend", "aws")): 2.0}
    verdicts = {labels[1][1]: v for labels, v in m["trainmaster_verdicts"].items()}
    assert verdicts == {"accepted": 2, "rejected": 1, "cannot_verify": 0}
    used = {labels[1][1]: v for labels, v in m["trainmaster_budget_used_usd"].items()}
    assert used == {"month: all spend": 3.75, "total: backend=local": 1.5}  # 1.5 + 0.25 charged + 2 held
    cap = {labels[1][1]: v for labels, v in m["trainmaster_budget_cap_usd"].items()}
    assert cap == {"month: all spend": 10.0, "total: backend=local": 1.0}
    assert "trainmaster_trigger_lag_seconds" not in m  # no lag source given


def test_queue_latency_is_submission_to_first_dispatch(known):
    known.store.db.execute("UPDATE jobs SET created_at = created_at - 90 WHERE id = 'a'")  # submitted 90 s earlier
    served = serve(known.path)
    try:
        h = scrape(served.url)["trainmaster_queue_latency_seconds"]
    finally:
        served.stop()
    bucket = {dict(k[1:])["le"]: v for k, v in h.items() if k[0].endswith("_bucket")}
    assert bucket["60.0"] == 3 and bucket["300.0"] == 4 and bucket["+Inf"] == 4  # `e` was never dispatched
    assert h[("trainmaster_queue_latency_seconds_count",)] == 4
    assert 90 <= h[("trainmaster_queue_latency_seconds_sum",)] < 95


def test_a_new_scrape_sees_new_rows_and_the_trigger_lag(known):
    lags = {"nightly": 12.5}
    served = serve(known.path, lag_source=lambda: lags)
    try:
        first = scrape(served.url)
        known.accept("d", "d.1", 1_000_000)
        lags["experience-stream"] = 3.0
        second = scrape(served.url)
    finally:
        served.stop()
    key = ("trainmaster_spend_usd_total", ("backend", "aws"))
    assert key not in first["trainmaster_spend_usd"] and second["trainmaster_spend_usd"][key] == 1.0
    assert "trainmaster_reserved_usd" in first and "trainmaster_reserved_usd" not in second  # nothing held now
    lag = {labels[1][1]: v for labels, v in second["trainmaster_trigger_lag_seconds"].items()}
    assert lag == {"nightly": 12.5, "experience-stream": 3.0}


def test_a_store_without_ledger_or_verdicts_reads_as_zero_and_is_not_written(tmp_path):
    from trainmaster.broker.store import Store

    store = Store(tmp_path / "state.db")  # jobs tables only: no ledger_entries, no verdicts
    served = serve(tmp_path / "state.db")
    try:
        m = scrape(served.url)
    finally:
        served.stop()
    assert set(m["trainmaster_jobs"].values()) == {0}
    assert "trainmaster_spend_usd" not in m and set(m["trainmaster_verdicts"].values()) == {0}
    tables = {r[0] for r in store.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "ledger_entries" not in tables and "verdicts" not in tables  # read-only: no part was migrated


def test_no_state_database_is_a_503_and_creates_nothing(tmp_path):
    served = serve(tmp_path / "state.db")
    try:
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(served.url + "/metrics")
    finally:
        served.stop()
    assert caught.value.code == 503 and "no state database" in caught.value.read().decode()
    assert not (tmp_path / "state.db").exists()
