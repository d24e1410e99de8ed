"""Job and verdict notifications: an outbox in `state.db` the daemon fills and POSTs to the policy's webhooks.

When a job ends (accepted, failed or cancelled: a `transition` event) or a verdict is recorded (a row of the
verify records' `verdicts`), one entry per webhook is made in `notifications`, keyed by the event or verdict it
tells of, so a pass that runs again (after a kill -9) makes none twice. The webhooks are those the job's policy
names for budget alerts: each budget of the policy the job was submitted under that covers the job and has a
`webhook`. Cursors (`notify_cursors`) keep how far the events and verdicts were read; they start where the
database stood when notifications were first set up, so a first start does not announce the past.

Delivery is at least once, as for budget alerts (wallet/outbox.py): an entry is marked delivered after a 2xx
answer; a process killed between the POST and the mark sends it again, with the same `id` in its payload for
the receiver to drop. An entry is given up after MAX_TRIES failed POSTs.

The tables are their own schema part (`daemon_notify_schema`).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from pathlib import Path

from trainmaster.broker import store
from trainmaster.broker.planning.policy import Policy, load_policy
from trainmaster.storage import statedb
from trainmaster.verify import records
from trainmaster.wallet.alerts import redact_urls

log = logging.getLogger("trainmaster.daemon")

MAX_TRIES = 10
MIGRATIONS: list[list[str]] = [
    [  # 1: the outbox and how far each source was read
        """CREATE TABLE notifications (
            key TEXT PRIMARY KEY,
            webhook TEXT NOT NULL,
            payload TEXT NOT NULL,
            at REAL NOT NULL,
            delivered_at REAL,
            tries INTEGER NOT NULL DEFAULT 0)""",
        "CREATE INDEX notifications_pending ON notifications(delivered_at, at)",
        "CREATE TABLE notify_cursors (source TEXT PRIMARY KEY, last_id INTEGER NOT NULL)",
    ],
]
_SOURCES = ("events", "verdicts")
"""The tables read, each with its cursor named after it."""


class Notifications:
    """The notification outbox on the state database at `path`, over a connection of its own."""

    def __init__(self, path: Path | str):
        self.db = statedb.connect(path)
        with statedb.immediate(self.db) as db:
            statedb.migrate(db, version_table="daemon_notify_schema", migrations=MIGRATIONS, what="the notifications")
            for table in _SOURCES:
                db.execute("INSERT INTO notify_cursors (source, last_id) VALUES (?, ?) ON CONFLICT DO NOTHING",
                           (table, _max_id(db, table)))

    def close(self) -> None:
        self.db.close()

    def collect(self) -> int:
        """Make the entries for the job ends and verdicts recorded since the last call; how many were made."""
        with statedb.immediate(self.db) as db:
            return self._job_ends(db) + self._verdicts(db)

    def pending(self) -> list[tuple[str, str, dict]]:
        """(key, webhook, payload) of each entry still to deliver, oldest first."""
        rows = self.db.execute("SELECT key, webhook, payload FROM notifications WHERE delivered_at IS NULL"
                               " AND tries < ? ORDER BY at, key", (MAX_TRIES,)).fetchall()
        return [(key, webhook, json.loads(payload)) for key, webhook, payload in rows]

    def mark(self, key: str, delivered: bool) -> None:
        """Count a POST of the entry, and mark it delivered when it got a 2xx."""
        with statedb.immediate(self.db) as db:
            db.execute("UPDATE notifications SET tries = tries + 1, delivered_at = ? WHERE key = ?",
                       (time.time() if delivered else None, key))

    def _job_ends(self, db: sqlite3.Connection) -> int:
        after = _cursor(db, "events")
        rows = store.job_ends_after(db, after)
        made = 0
        for row in rows:
            detail = json.loads(row["detail"]) if row["detail"] else {}
            payload = {"id": f"job-end:{row['id']}", "kind": "job_ended", "job": row["job_id"],
                       "state": row["to_state"], "reason": detail.get("reason"), "at": row["at"]}
            made += _enqueue(db, row["job_id"], payload)
        _advance(db, "events", store.newest_event_id(db), after)
        return made

    def _verdicts(self, db: sqlite3.Connection) -> int:
        if not _exists(db, "verdicts"):
            return 0
        after = _cursor(db, "verdicts")
        rows = records.verdicts_after(db, after)
        made = 0
        for row in rows:
            payload = {"id": f"verdict:{row['id']}", "kind": "verdict", "job": row["job_id"],
                       "attempt": row["attempt_id"], "outcome": row["outcome"],
                       "reasons": json.loads(row["verdict_json"]).get("reasons", []), "at": row["created_at"]}
            made += _enqueue(db, row["job_id"], payload)
        _advance(db, "verdicts", records.newest_verdict_id(db), after)
        return made


async def deliver(notes: Notifications) -> int:
    """POST each pending entry once (the next call tries the failed ones again); how many were delivered."""
    import asyncio

    import aiohttp

    from trainmaster.wallet.outbox import post_json

    delivered = 0
    for key, url, payload in await asyncio.to_thread(notes.pending):
        try:
            ok = 200 <= await post_json(url, payload) < 300
        except (OSError, asyncio.TimeoutError, aiohttp.ClientError) as exc:
            log.warning("notification %s to %s failed: %s (kept; tried again)", payload["id"], redact_urls(url), exc)
            ok = False
        await asyncio.to_thread(notes.mark, key, ok)
        delivered += ok
    return delivered


def webhooks(db: sqlite3.Connection, job_id: str) -> list[str]:
    """The webhooks of the budgets that cover the job, in the policy it was submitted under."""
    found = store.budget_scope(db, job_id)
    if found is None:
        return []
    job, backends = found
    policy = Policy.model_validate_json(job["policy_json"]) if job["policy_json"] else load_policy(job["policy"])
    return list(dict.fromkeys(
        b.webhook for b in policy.budgets
        if b.webhook and (b.workload is None or b.workload == job["workload"])
        and (b.project is None or b.project == job["project"]) and (b.backend is None or b.backend in backends)))


def _enqueue(db: sqlite3.Connection, job_id: str, payload: dict) -> int:
    made = 0
    for url in webhooks(db, job_id):
        made += db.execute("INSERT INTO notifications (key, webhook, payload, at) VALUES (?, ?, ?, ?)"
                           " ON CONFLICT DO NOTHING",
                           (f"{payload['id']} {url}", url, json.dumps(payload, sort_keys=True),
                            time.time())).rowcount
    return made


def _cursor(db: sqlite3.Connection, source: str) -> int:
    return db.execute("SELECT last_id FROM notify_cursors WHERE source = ?", (source,)).fetchone()[0]


def _advance(db: sqlite3.Connection, source: str, newest: int | None, after: int) -> None:
    newest = newest or 0
    db.execute("UPDATE notify_cursors SET last_id = ? WHERE source = ?", (max(after, newest), source))


def _exists(db: sqlite3.Connection, table: str) -> bool:
    return statedb.table_exists(db, table)


def _max_id(db: sqlite3.Connection, table: str) -> int:
    return db.execute(f"SELECT COALESCE(MAX(id), 0) FROM {table}").fetchone()[0] if _exists(db, table) else 0
