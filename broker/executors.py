"""Executors we do not control, across jobs: who is banned, and how each one has done.

An untrusted attempt that ends rejected (its work failed a check, or it did not answer its
challenge) bans the executor's hotkey and, where it has one, its coldkey — the owner, whose other
hotkeys are banned with it. A ban lasts until a person lifts it (`trainmaster executors unban`); the
planner blocks every offer of a banned hotkey or coldkey, in every job. Reputation is what the
attempts table already holds, counted per hotkey; the planner prices it as a failure rate keyed by
the offer (`failure_rates`).

The table shares `state.db` with the store and keeps its own schema version, like the ledger.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass

from trainmaster.storage import statedb

KINDS = ("hotkey", "coldkey")

MIGRATIONS: list[list[str]] = [
    [  # 1: bans by hotkey or coldkey; a lifted ban keeps its row (and who lifted it when)
        """CREATE TABLE bans (
        kind TEXT NOT NULL CHECK (kind IN ('hotkey', 'coldkey')),
        key TEXT NOT NULL,
        reason TEXT NOT NULL,
        job_id TEXT,
        attempt_id TEXT,
        "by" TEXT NOT NULL,
        at REAL NOT NULL,
        lifted_at REAL,
        PRIMARY KEY (kind, key)
    )""",
    ],
]


@dataclass(frozen=True)
class Ban:
    kind: str
    """`hotkey` or `coldkey`."""
    key: str
    reason: str
    job_id: str | None
    attempt_id: str | None
    by: str
    """`verdict` (a rejected attempt) or `user`."""
    at: float
    lifted_at: float | None

    @property
    def active(self) -> bool:
        return self.lifted_at is None


@dataclass(frozen=True)
class Record:
    """How one hotkey's attempts ended (its coldkey as last seen)."""

    hotkey: str
    coldkey: str | None
    accepted: int
    rejected: int
    failed: int
    last_at: float

    @property
    def attempts(self) -> int:
        return self.accepted + self.rejected + self.failed


class Executors:
    """Bans and reputation on the state database's connection (the store's own, so a ban and the move
    that caused it can share a transaction)."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db
        with statedb.immediate(db):
            statedb.migrate(db, version_table="executors_schema", migrations=MIGRATIONS, what="the executor bans")

    def ban(self, kind: str, key: str, *, reason: str, by: str, job_id: str | None = None,
            attempt_id: str | None = None) -> bool:
        """Ban `key`; False when it is banned already (the first ban's reason stands)."""
        if kind not in KINDS:
            raise ValueError(f"a ban is by hotkey or coldkey, not {kind!r}")
        with statedb.immediate(self.db) as db:
            row = db.execute("SELECT lifted_at FROM bans WHERE kind = ? AND key = ?", (kind, key)).fetchone()
            if row is not None and row["lifted_at"] is None:
                return False
            db.execute("INSERT INTO bans VALUES (?,?,?,?,?,?,?,NULL) ON CONFLICT (kind, key) DO UPDATE SET"
                       " reason = excluded.reason, job_id = excluded.job_id, attempt_id = excluded.attempt_id,"
                       ' "by" = excluded."by", at = excluded.at, lifted_at = NULL',
                       (kind, key, reason, job_id, attempt_id, by, time.time()))
            return True

    def lift(self, key: str) -> list[Ban]:
        """Lift the active bans of `key` (as a hotkey, a coldkey or both); the bans lifted."""
        lifted = [b for b in self.bans() if b.key == key]
        with statedb.immediate(self.db) as db:
            db.execute("UPDATE bans SET lifted_at = ? WHERE key = ? AND lifted_at IS NULL", (time.time(), key))
        return lifted

    def bans(self, *, include_lifted: bool = False) -> list[Ban]:
        sql = "SELECT * FROM bans" + ("" if include_lifted else " WHERE lifted_at IS NULL") + " ORDER BY at, key"
        return [Ban(**r) for r in self.db.execute(sql).fetchall()]

    def banned(self) -> tuple[frozenset[str], frozenset[str]]:
        """The banned (hotkeys, coldkeys), for the planner."""
        active = self.bans()
        return (frozenset(b.key for b in active if b.kind == "hotkey"),
                frozenset(b.key for b in active if b.kind == "coldkey"))

    def records(self) -> list[Record]:
        """Every hotkey that ran an attempt, with how its ended attempts ended."""
        from trainmaster.broker.store import executor_records

        return [Record(**r) for r in executor_records(self.db)]


def ban_rejected(executors: Executors, *, hotkey: str | None, coldkey: str | None, reason: str, job_id: str,
                 attempt_id: str) -> None:
    """A rejected attempt bans who ran it: its hotkey and its coldkey (every hotkey of that owner)."""
    for kind, key in (("hotkey", hotkey), ("coldkey", coldkey)):
        if key:
            executors.ban(kind, key, reason=reason, by="verdict", job_id=job_id, attempt_id=attempt_id)
