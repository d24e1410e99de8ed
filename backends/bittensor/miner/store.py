"""The miner's attempts in SQLite (`<home>/miner.db`): who dispatched each, the hash of the body it came
with (a resend is compared against it), the quote it was made on (found by its quote_id: one attempt per
quote) and the challenge digest published with it, the local backend's handle, when it was accepted and
concluded, and what the broker told it at `conclude` with the countersignature given, so a miner killed
with kill -9 and started again answers for every attempt it ran and every conclusion it acknowledged."""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS attempts (
    attempt_id TEXT PRIMARY KEY,
    caller TEXT NOT NULL,
    body_sha256 TEXT NOT NULL,
    quote_json TEXT NOT NULL,
    challenge_digest TEXT NOT NULL,
    handle_json TEXT NOT NULL,
    accepted_json TEXT NOT NULL,
    created_at REAL NOT NULL,
    concluded_at REAL,
    told_json TEXT,
    countersignature TEXT
)"""
QUOTE_INDEX = "CREATE INDEX IF NOT EXISTS attempts_by_quote ON attempts (json_extract(quote_json, '$.quote_id'))"


@dataclass(frozen=True)
class Attempt:
    attempt_id: str
    caller: str
    body_sha256: str
    quote_json: str
    challenge_digest: str
    handle_json: str
    accepted_json: str
    created_at: float
    concluded_at: float | None
    told_json: str | None
    countersignature: str | None


class AttemptStore:
    def __init__(self, path: Path):
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(SCHEMA)
        self._db.execute(QUOTE_INDEX)
        self._lock = threading.Lock()

    def get(self, attempt_id: str) -> Attempt | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM attempts WHERE attempt_id = ?", (attempt_id,)).fetchone()
        return Attempt(*row) if row else None

    def on_quote(self, quote_id: str) -> Attempt | None:
        """The attempt dispatched on the quote `quote_id`, if any."""
        with self._lock:
            row = self._db.execute("SELECT * FROM attempts WHERE json_extract(quote_json, '$.quote_id') = ?",
                                   (quote_id,)).fetchone()
        return Attempt(*row) if row else None

    def unconcluded(self) -> list[Attempt]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM attempts WHERE concluded_at IS NULL").fetchall()
        return [Attempt(*row) for row in rows]

    def add(self, attempt: Attempt) -> None:
        with self._lock:
            self._db.execute("INSERT INTO attempts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             (attempt.attempt_id, attempt.caller, attempt.body_sha256, attempt.quote_json, attempt.challenge_digest,
                              attempt.handle_json, attempt.accepted_json, attempt.created_at, None, None, None))

    def conclude(self, attempt_id: str, told_json: str, countersignature: str) -> None:
        with self._lock:
            self._db.execute("UPDATE attempts SET concluded_at = ?, told_json = ?, countersignature = ? "
                             "WHERE attempt_id = ? AND concluded_at IS NULL",
                             (time.time(), told_json, countersignature, attempt_id))

    def close(self) -> None:
        self._db.close()
