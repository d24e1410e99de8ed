"""Verification records in the broker's SQLite database: verdicts and challenge secrets.

The verification module owns its own tables (``verdicts``, ``commitments``, ``challenge_secrets``)
and its own schema version (table ``verify_schema``) in the broker's ``state.db``; it never touches
the broker's tables or imports the broker. WAL mode; every write is one ``BEGIN IMMEDIATE``
transaction.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from trainmaster.storage import statedb

from .challenge_secret import new_secret, secret_digest
from .errors import VerificationError

if TYPE_CHECKING:
    from .verdict import Verdict

SCHEMA_VERSION = 1
MIGRATIONS: list[list[str]] = [
    [  # 1
        """CREATE TABLE IF NOT EXISTS verdicts (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id TEXT NOT NULL,
            attempt_id TEXT,
            outcome TEXT NOT NULL,
            verdict_json TEXT NOT NULL,
            created_at REAL NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS verdicts_job ON verdicts(job_id, id)",
        """CREATE TABLE IF NOT EXISTS commitments (
            job_id TEXT NOT NULL,
            attempt_id TEXT NOT NULL,
            commitment_json TEXT NOT NULL,
            signature TEXT,
            hotkey TEXT,
            stored_at REAL NOT NULL,
            PRIMARY KEY (job_id, attempt_id))""",
        """CREATE TABLE IF NOT EXISTS challenge_secrets (
            job_id TEXT NOT NULL,
            attempt_id TEXT NOT NULL,
            secret_hex TEXT NOT NULL,
            digest TEXT NOT NULL,
            created_at REAL NOT NULL,
            revealed_at REAL,
            PRIMARY KEY (job_id, attempt_id))""",
    ],
]


class Database:
    """A connection to ``state.db`` with the verification schema in place."""

    def __init__(self, path: Path | str):
        self.path = path  # a SQLite file's path or a `postgresql://` URL
        self.db = statedb.connect(path)
        self._migrate()

    def close(self) -> None:
        self.db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def write(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction, taken up front so check-then-write is atomic across processes."""
        return statedb.immediate(self.db)

    def _migrate(self) -> None:
        with self.write() as db:
            try:
                statedb.migrate(db, version_table="verify_schema", migrations=MIGRATIONS,
                                what=f"{self.path} (verification schema)")
            except statedb.SchemaTooNew as exc:
                raise VerificationError(str(exc), kind="cannot_verify") from None


class VerdictStore:
    """Append-only verdicts per job and attempt; re-verifying an attempt adds a row, the newest counts."""

    def __init__(self, path: Path):
        self.database = Database(path)

    def close(self) -> None:
        self.database.close()

    def record(self, verdict: Verdict, *, job_id: str | None = None, attempt_id: str | None = None) -> int:
        """Store ``verdict`` (job and attempt default to the verdict's own); returns its row id."""
        job_id = job_id or verdict.job_id
        if not job_id:
            raise ValueError("a verdict is stored under a job id")
        with self.database.write() as db:
            return int(db.execute(
                "INSERT INTO verdicts (job_id, attempt_id, outcome, verdict_json, created_at) VALUES (?, ?, ?, ?, ?)"
                " RETURNING id",
                (job_id, attempt_id or verdict.attempt_id, verdict.outcome, verdict.model_dump_json(), time.time()),
            ).fetchone()[0])

    def latest(self, job_id: str, attempt_id: str | None = None) -> Verdict | None:
        """The newest verdict for the job (or for one of its attempts)."""
        query, args = "SELECT verdict_json FROM verdicts WHERE job_id = ?", [job_id]
        if attempt_id is not None:
            query, args = query + " AND attempt_id = ?", [job_id, attempt_id]
        row = self.database.db.execute(query + " ORDER BY id DESC LIMIT 1", args).fetchone()
        from .verdict import Verdict  # pydantic: not imported by what reads evidence only (`latest_evidence`)

        return Verdict.model_validate_json(row["verdict_json"]) if row else None

    def latest_id(self, job_id: str, attempt_id: str) -> int | None:
        """The row id of an attempt's newest verdict: what names its evidence (the promotion lineage's)."""
        row = self.database.db.execute(
            "SELECT id FROM verdicts WHERE job_id = ? AND attempt_id = ? ORDER BY id DESC LIMIT 1",
            (job_id, attempt_id)).fetchone()
        return int(row["id"]) if row else None

    def latest_evidence(self, job_id: str, attempt_id: str) -> dict | None:
        """The newest verdict of an attempt as stored (its JSON, not validated again): what `status` shows of
        it, without building the model."""
        row = self.database.db.execute(
            "SELECT verdict_json FROM verdicts WHERE job_id = ? AND attempt_id = ? ORDER BY id DESC LIMIT 1",
            (job_id, attempt_id)).fetchone()
        return json.loads(row["verdict_json"]) if row else None

    def history(self, job_id: str) -> list[Verdict]:
        from .verdict import Verdict

        rows = self.database.db.execute("SELECT verdict_json FROM verdicts WHERE job_id = ? ORDER BY id", (job_id,))
        return [Verdict.model_validate_json(r["verdict_json"]) for r in rows]

    def matching_jobs(self, ref: str, most: int = 3) -> list[str]:
        """Jobs with a verdict whose id is ``ref`` or starts with it (at most ``most``; an exact id alone)."""
        rows = self.database.db.execute(
            "SELECT DISTINCT job_id FROM verdicts WHERE job_id = ? OR substr(job_id, 1, ?) = ? ORDER BY job_id LIMIT ?",
            (ref, len(ref), ref, most),
        ).fetchall()
        ids = [r["job_id"] for r in rows]
        return [ref] if ref in ids else ids

    def resolve_job(self, ref: str) -> str | None:
        """The job id ``ref`` names: an exact id, or a prefix matching exactly one job with a verdict."""
        ids = self.matching_jobs(ref)
        return ids[0] if len(ids) == 1 else None


class SecretStore:
    """The challenge secret of each attempt: created before dispatch, revealed only after its verdict.

    Only ``sha256(secret)`` leaves the broker before the verdict. A secret is per attempt: revealing
    a job-wide secret after one attempt's verdict would hand the next executor its challenge.
    """

    def __init__(self, path: Path):
        self.database = Database(path)

    def close(self) -> None:
        self.database.close()

    def secret_for(self, job_id: str, attempt_id: str) -> bytes:
        """The attempt's secret, created on first use (idempotent across restarts)."""
        with self.database.write() as db:
            row = db.execute(
                "SELECT secret_hex FROM challenge_secrets WHERE job_id = ? AND attempt_id = ?", (job_id, attempt_id)
            ).fetchone()
            if row:
                return bytes.fromhex(row["secret_hex"])
            secret = new_secret()
            db.execute(
                "INSERT INTO challenge_secrets (job_id, attempt_id, secret_hex, digest, created_at) VALUES (?, ?, ?, ?, ?)",
                (job_id, attempt_id, secret.hex(), secret_digest(secret), time.time()),
            )
            return secret

    def digest(self, job_id: str, attempt_id: str) -> str:
        """``sha256(secret)``, safe to publish at any time."""
        return secret_digest(self.secret_for(job_id, attempt_id))

    def reveal(self, job_id: str, attempt_id: str) -> bytes:
        """The secret, for the executor to check its challenge — refused until a verdict is stored."""
        with self.database.write() as db:
            decided = db.execute(
                "SELECT 1 FROM verdicts WHERE job_id = ? AND attempt_id = ? LIMIT 1", (job_id, attempt_id)
            ).fetchone()
            if not decided:
                raise VerificationError(
                    f"the challenge secret of {job_id}/{attempt_id} is revealed only after its verdict",
                    kind="cannot_verify",
                )
            row = db.execute(
                "SELECT secret_hex FROM challenge_secrets WHERE job_id = ? AND attempt_id = ?", (job_id, attempt_id)
            ).fetchone()
            if not row:
                raise VerificationError(f"no challenge secret was created for {job_id}/{attempt_id}", kind="cannot_verify")
            db.execute(
                "UPDATE challenge_secrets SET revealed_at = COALESCE(revealed_at, ?) WHERE job_id = ? AND attempt_id = ?",
                (time.time(), job_id, attempt_id),
            )
            return bytes.fromhex(row["secret_hex"])


# What others read of the verdicts (the daemon's metrics, dashboard and notifications), each on a connection the
# caller holds: the one place outside the stores above the table is named in SQL (tests/repo/test_sql_owners.py).

def verdict_counts(db) -> dict[str, int]:
    """Verdicts recorded per outcome that has any (a re-verification counts again)."""
    return {r[0]: r[1] for r in db.execute("SELECT outcome, COUNT(*) FROM verdicts GROUP BY outcome")}


def newest_verdicts(db, limit: int) -> list:
    """Rows (job_id, attempt_id, outcome, verdict_json, created_at) of the newest verdicts, newest first."""
    return db.execute("SELECT job_id, attempt_id, outcome, verdict_json, created_at FROM verdicts"
                      " ORDER BY id DESC LIMIT ?", (limit,)).fetchall()


def verdicts_after(db, after: int) -> list:
    """Rows (id, job_id, attempt_id, outcome, verdict_json, created_at) of the verdicts recorded after `after`."""
    return db.execute("SELECT id, job_id, attempt_id, outcome, verdict_json, created_at FROM verdicts"
                      " WHERE id > ? ORDER BY id", (after,)).fetchall()


def newest_verdict_id(db) -> int | None:
    return db.execute("SELECT MAX(id) FROM verdicts").fetchone()[0]


# The commitments' rows, for verify/commitments.py (which checks what is stored and read): the one place the table
# is named in SQL (tests/repo/test_sql_owners.py).

def other_commitments(db, job_id: str, attempt_id: str) -> list:
    """Rows (attempt_id, commitment_json) of the job's commitments by its other attempts."""
    return db.execute("SELECT attempt_id, commitment_json FROM commitments WHERE job_id = ? AND attempt_id != ?",
                      (job_id, attempt_id)).fetchall()


def commitment_row(db, job_id: str, attempt_id: str):
    """The attempt's stored commitment row, or None."""
    return db.execute("SELECT * FROM commitments WHERE job_id = ? AND attempt_id = ?", (job_id, attempt_id)).fetchone()


def insert_commitment(db, job_id: str, attempt_id: str, text: str, signature: str | None, hotkey: str | None) -> None:
    db.execute(
        "INSERT INTO commitments (job_id, attempt_id, commitment_json, signature, hotkey, stored_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        (job_id, attempt_id, text, signature, hotkey, time.time()),
    )
