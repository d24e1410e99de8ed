"""What was spent, read from the ledger's rows without the Ledger (wallet/ledger.py): `trainmaster spend` is a
read, so it imports neither the budgets (and their pydantic models) nor the webhook outbox, and migrates and
delivers nothing. The ledger's own `Ledger.spend` is this function."""

from __future__ import annotations

from dataclasses import dataclass

from trainmaster.storage import statedb

SQL_PART_OF = "wallet/ledger.py"
"""The ledger's read side: its `ledger_entries` are the ledger's (tests/sql_owners.py)."""

COLUMNS_GROUPED = {
    "backend": "backend",
    "class": "workload",
    "job": "job_id",
    "project": "COALESCE(project, '-')",
}
GROUPS = (*COLUMNS_GROUPED, "month")
"""What spend is grouped by; `month` is the UTC month of `at`, in each database's own words."""


@dataclass(frozen=True)
class SpendRow:
    group: str
    micro_usd: int
    rao: int
    charges: int


def spend_rows(db, by: str | None = None, *, since: float | None = None, until: float | None = None) -> list[SpendRow]:
    """Actual spend (charges only) on the connection `db`, grouped by backend, class, job, project or month."""
    if by is not None and by not in GROUPS:
        raise ValueError(f"cannot group spend by {by!r}; choose one of {', '.join(GROUPS)}")
    if not statedb.table_exists(db, "ledger_entries"):
        return [SpendRow("total", 0, 0, 0)] if by is None else []
    group = "'total'" if by is None else COLUMNS_GROUPED.get(by) or statedb.dialect(db).month("at")
    where, args = ["kind = 'charge'"], []
    if since is not None:
        where.append("at >= ?")
        args.append(since)
    if until is not None:
        where.append("at < ?")
        args.append(until)
    order = "g" if by == "month" else "SUM(micro_usd) DESC, g"
    rows = db.execute(
        f"SELECT {group} AS g, SUM(micro_usd), SUM(rao), COUNT(*) FROM ledger_entries"
        f" WHERE {' AND '.join(where)} GROUP BY g ORDER BY {order}",
        args,
    ).fetchall()
    if by is None and not rows:
        return [SpendRow("total", 0, 0, 0)]
    return [SpendRow(*row) for row in rows]


def charge_groups(db, keys: list[str], by: str | None) -> dict[str, str]:
    """charge key -> its group as `Ledger.spend(by)` groups its charges ('total' when `by` is None), for those of
    `keys` the ledger holds."""
    group = "'total'" if by is None else (COLUMNS_GROUPED[by] if by in COLUMNS_GROUPED
                                          else statedb.dialect(db).month("at"))
    found: dict[str, str] = {}
    for i in range(0, len(keys), 500):  # within any database's limit on parameters
        chunk = keys[i:i + 500]
        found.update({row[0]: row[1] for row in db.execute(
            f"SELECT key, {group} FROM ledger_entries WHERE key IN ({','.join('?' * len(chunk))})", chunk)})
    return found
