"""The PostgreSQL dialect's NUMERIC loader: whole sums come back as `int`, through one loader class however many
connections are opened (a class made per connection was kept for the process's life: a daemon's memory grew with
the jobs it ran)."""

from __future__ import annotations

import gc

from trainmaster.storage.dialects import postgresql


def _loader_classes() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, type) and o.__name__ == "WholeNumericLoader")


def test_connections_share_one_numeric_loader_class(postgres_url):
    first = postgresql.connect(postgres_url)
    try:
        assert first.execute("SELECT SUM(x) FROM (VALUES (2::bigint), (3::bigint)) AS t(x)").fetchone()[0] == 5
    finally:
        first.close()
    before = _loader_classes()
    for _ in range(20):
        postgresql.connect(postgres_url).close()
    gc.collect()
    assert _loader_classes() == before == 1
