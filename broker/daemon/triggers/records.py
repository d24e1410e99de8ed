"""The triggers' own tables in `state.db` (schema part `trigger_schema`): each fire, and each trigger's baseline.

A fire is recorded, with its idempotency key and the data cursor seen, before its job is submitted; the job id
is added once the submit returns (or the submit's error, which ends the fire). A trigger's baseline is the
cursor of its last fire whose job was accepted: data counts as new against it.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from trainmaster.storage import statedb

MIGRATIONS: list[list[str]] = [
    [  # 1
        """CREATE TABLE trigger_fires (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            trigger TEXT NOT NULL,
            key TEXT NOT NULL UNIQUE,
            reason TEXT NOT NULL,
            spec_path TEXT NOT NULL,
            policy TEXT NOT NULL,
            slot REAL,
            cursor_json TEXT,
            fired_at REAL NOT NULL,
            job_id TEXT,
            error TEXT)""",
        "CREATE INDEX trigger_fires_trigger ON trigger_fires(trigger, id)",
        """CREATE TABLE trigger_baselines (
            trigger TEXT PRIMARY KEY,
            fire_id INTEGER NOT NULL,
            cursor_json TEXT,
            at REAL NOT NULL)""",
        """CREATE TABLE trigger_starts (
            trigger TEXT PRIMARY KEY,
            at REAL NOT NULL)""",
    ],
]


@dataclass(frozen=True)
class Fire:
    id: int
    trigger: str
    key: str
    reason: str
    spec_path: str
    policy: str
    slot: float | None
    cursor: dict | None
    fired_at: float
    job_id: str | None
    error: str | None

    @property
    def pending(self) -> bool:
        """Recorded, but its submit has not returned yet (or the process died in it)."""
        return self.job_id is None and self.error is None


class Records:
    """A connection to `state.db` with the triggers' schema in place."""

    def __init__(self, path: Path):
        self.db = statedb.connect(path)
        with statedb.immediate(self.db) as db:
            statedb.migrate(db, version_table="trigger_schema", migrations=MIGRATIONS, what=f"{path} (triggers)")

    def close(self) -> None:
        self.db.close()

    def started(self, trigger: str, now: float) -> float:
        """When the trigger was first seen (recorded now if never): a schedule is due only after it."""
        row = self.db.execute("SELECT at FROM trigger_starts WHERE trigger = ?", (trigger,)).fetchone()
        if row is not None:
            return row[0]
        with statedb.immediate(self.db) as db:
            db.execute("INSERT INTO trigger_starts (trigger, at) VALUES (?, ?) ON CONFLICT DO NOTHING", (trigger, now))
            return db.execute("SELECT at FROM trigger_starts WHERE trigger = ?", (trigger,)).fetchone()[0]

    def record(self, *, trigger: str, key: str, reason: str, spec_path: str, policy: str, slot: float | None,
               cursor: dict | None, now: float) -> Fire | None:
        """Record a fire; None when one with this key exists already (the same slot or data, fired before)."""
        try:
            with statedb.immediate(self.db) as db:
                db.execute("INSERT INTO trigger_fires (trigger, key, reason, spec_path, policy, slot, cursor_json,"
                           " fired_at) VALUES (?,?,?,?,?,?,?,?)",
                           (trigger, key, reason, spec_path, policy, slot, _dump(cursor), now))
        except statedb.IntegrityError:
            return None
        return self.fire(key)

    def fire(self, key: str) -> Fire:
        return _fire(self.db.execute("SELECT * FROM trigger_fires WHERE key = ?", (key,)).fetchone())

    def last(self, trigger: str) -> Fire | None:
        row = self.db.execute("SELECT * FROM trigger_fires WHERE trigger = ? ORDER BY id DESC LIMIT 1",
                              (trigger,)).fetchone()
        return _fire(row) if row else None

    def last_slot(self, trigger: str) -> float | None:
        row = self.db.execute("SELECT MAX(slot) FROM trigger_fires WHERE trigger = ?", (trigger,)).fetchone()
        return row[0]

    def pending(self) -> list[Fire]:
        rows = self.db.execute("SELECT * FROM trigger_fires WHERE job_id IS NULL AND error IS NULL ORDER BY id")
        return [_fire(r) for r in rows.fetchall()]

    def submitted(self, fire_id: int, job_id: str) -> None:
        with statedb.immediate(self.db) as db:
            db.execute("UPDATE trigger_fires SET job_id = ? WHERE id = ? AND job_id IS NULL", (job_id, fire_id))

    def refused(self, fire_id: int, error: str) -> None:
        with statedb.immediate(self.db) as db:
            db.execute("UPDATE trigger_fires SET error = ? WHERE id = ? AND job_id IS NULL", (error, fire_id))

    def baseline(self, trigger: str) -> tuple[int, dict | None] | None:
        """(fire id, cursor) of the trigger's last accepted fire, None before its first."""
        row = self.db.execute("SELECT fire_id, cursor_json FROM trigger_baselines WHERE trigger = ?",
                              (trigger,)).fetchone()
        return (row[0], _load(row[1])) if row else None

    def accept(self, fire: Fire, now: float) -> None:
        """The fire's job was accepted: its cursor becomes the trigger's baseline (never an older fire's)."""
        with statedb.immediate(self.db) as db:
            db.execute("INSERT INTO trigger_baselines (trigger, fire_id, cursor_json, at) VALUES (?,?,?,?)"
                       " ON CONFLICT(trigger) DO UPDATE SET fire_id = excluded.fire_id,"
                       " cursor_json = excluded.cursor_json, at = excluded.at"
                       " WHERE excluded.fire_id > trigger_baselines.fire_id",
                       (fire.trigger, fire.id, _dump(fire.cursor), now))


def _fire(row: sqlite3.Row) -> Fire:
    values = dict(row)
    values["cursor"] = _load(values.pop("cursor_json"))
    return Fire(**values)


def _dump(cursor: dict | None) -> str | None:
    return json.dumps(cursor, sort_keys=True) if cursor is not None else None


def _load(text: str | None) -> dict | None:
    return json.loads(text) if text is not None else None
