"""Each schema part answers for its own tables: a table is named in SQL only by the module that creates it (its
migrations), and every other module reads it through what that owner exposes (broker/store.py, wallet/ledger.py,
wallet/payments.py, wallet/alert_records.py, verify/records.py, broker/money/conclusions.py, ...). The check is
tests/sql_owners.py (string literals read as SQL, tables after FROM, JOIN, INTO or UPDATE); bench_structure.py
prints the same count.
"""

from __future__ import annotations


from sql_owners import foreign_statements, table_owners
from repo_paths import ROOT



def test_every_table_has_an_owner_that_creates_it():
    owners = table_owners(ROOT)
    for table in ("jobs", "attempts", "events", "ledger_entries", "ledger_alerts", "payments", "verdicts",
                  "commitments", "conclusions"):
        assert table in owners, f"no module creates {table}"
    assert owners["jobs"] == {"broker/store.py"}
    assert owners["ledger_entries"] == {"wallet/ledger.py"}
    assert owners["verdicts"] == {"verify/records.py"}
    assert owners["conclusions"] == {"broker/money/conclusions.py"}
    assert owners["ledger_alerts"] == {"wallet/alert_records.py"}


def test_no_sql_names_a_table_outside_its_owner():
    found = foreign_statements(ROOT)
    assert not found, "SQL naming another part's table (read it through what its owner exposes):\n" + "\n".join(
        f"  {f.where}: {f.table} (owned by {', '.join(f.owners)})" for f in found)


def test_the_check_sees_a_daemon_module_reading_the_brokers_jobs(tmp_path):
    (tmp_path / "broker" / "daemon").mkdir(parents=True)
    (tmp_path / "broker" / "store.py").write_text('MIGRATIONS = [["CREATE TABLE jobs (id TEXT)"]]\n')
    (tmp_path / "broker" / "daemon" / "view.py").write_text(
        'def states(db):\n    return db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()\n'
        'def named(db, table):\n    return db.execute(f"SELECT id FROM jobs j JOIN {table} x ON x.id = j.id")\n')
    found = foreign_statements(tmp_path)
    assert sorted((f.where, f.table, f.owners) for f in found) == [
        ("broker/daemon/view.py:2", "jobs", ("broker/store.py",)),
        ("broker/daemon/view.py:4", "jobs", ("broker/store.py",)),
    ]
