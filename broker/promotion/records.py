"""The promotion records in the broker's `state.db`, in their own schema part (version table
`promotion_schema`): one row per accepted job with its lineage and how far its registration went, and
every move of a model's `production` alias.

A registration's `state` is how far it got, so that a process that died half-way resumes it without
registering twice: `local` (no registry configured: lineage only), `pending` (to register), `run` (its MLflow
run exists: `run_id`), `registered` (its model version exists: `version`), `done` (the gate decided: `gate`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from trainmaster.storage import statedb

MIGRATIONS: list[list[str]] = [
    [  # 1
        """CREATE TABLE IF NOT EXISTS promotions (
            job_id TEXT PRIMARY KEY,
            attempt_id TEXT NOT NULL,
            job_name TEXT NOT NULL,
            spec_sha256 TEXT NOT NULL,
            bundle_sha256 TEXT NOT NULL,
            commitment_root TEXT,
            verdict TEXT NOT NULL,
            verdict_id INTEGER,
            metrics_json TEXT NOT NULL,
            thresholds_json TEXT NOT NULL,
            cost_micro_usd INTEGER NOT NULL,
            model_name TEXT,
            state TEXT NOT NULL,
            run_id TEXT,
            version TEXT,
            gate TEXT,
            gate_reasons_json TEXT,
            error TEXT,
            recorded_at REAL NOT NULL,
            updated_at REAL NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS promotions_state ON promotions(state)",
        """CREATE TABLE IF NOT EXISTS alias_moves (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            model_name TEXT NOT NULL,
            version TEXT NOT NULL,
            previous_version TEXT,
            reason TEXT NOT NULL,
            at REAL NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS alias_moves_model ON alias_moves(model_name, id)",
    ],
]

UNFINISHED = ("pending", "run", "registered")


@dataclass(frozen=True)
class Lineage:
    """Where an accepted checkpoint came from: what the model version's tags and the records carry."""

    job_id: str
    attempt_id: str
    job_name: str
    spec_sha256: str
    bundle_sha256: str
    commitment_root: str | None
    verdict: str
    verdict_id: int | None
    metrics: dict[str, float]
    thresholds: dict[str, float]
    cost_micro_usd: int


@dataclass(frozen=True)
class Promotion:
    lineage: Lineage
    model_name: str | None
    state: str
    run_id: str | None
    version: str | None
    gate: str | None
    gate_reasons: list[str]
    error: str | None
    recorded_at: float
    updated_at: float = 0.0
    """When the promotion last moved or failed (its error recorded)."""


@dataclass(frozen=True)
class AliasMove:
    model_name: str
    version: str
    previous_version: str | None
    reason: str
    at: float


def unfinished_exist(db) -> bool:
    """Whether a registration is left to carry on, read on any connection to `state.db` without migrating
    (what tells a command that its reconcile pass has something to do)."""
    if not statedb.table_exists(db, "promotions"):
        return False
    return db.execute(f"SELECT 1 FROM promotions WHERE state IN ({','.join('?' * len(UNFINISHED))}) LIMIT 1",
                      UNFINISHED).fetchone() is not None


class PromotionStore:
    def __init__(self, path: Path):
        self.db = statedb.connect(path)
        with statedb.immediate(self.db) as db:
            statedb.migrate(db, version_table="promotion_schema", migrations=MIGRATIONS,
                            what=f"{path} (promotion schema)")

    def close(self) -> None:
        self.db.close()

    def record(self, lineage: Lineage, *, pending: bool) -> Promotion:
        """Record the accepted job's lineage once (`pending` when a registry is configured, else `local`);
        the promotion as stored, whether new or recorded by an earlier call."""
        now = time.time()
        with statedb.immediate(self.db) as db:
            db.execute(
                "INSERT INTO promotions (job_id, attempt_id, job_name, spec_sha256, bundle_sha256,"
                " commitment_root, verdict, verdict_id, metrics_json, thresholds_json, cost_micro_usd,"
                " state, recorded_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                (lineage.job_id, lineage.attempt_id, lineage.job_name, lineage.spec_sha256, lineage.bundle_sha256,
                 lineage.commitment_root, lineage.verdict, lineage.verdict_id, json.dumps(lineage.metrics),
                 json.dumps(lineage.thresholds), lineage.cost_micro_usd, "pending" if pending else "local", now, now),
            )
        return self.get(lineage.job_id)

    def get(self, job_id: str) -> Promotion | None:
        row = self.db.execute("SELECT * FROM promotions WHERE job_id = ?", (job_id,)).fetchone()
        return _promotion(row) if row else None

    def unfinished(self) -> list[Promotion]:
        """Registrations not done yet, oldest first: what a reconcile pass retries."""
        rows = self.db.execute(
            f"SELECT * FROM promotions WHERE state IN ({','.join('?' * len(UNFINISHED))}) ORDER BY recorded_at",
            UNFINISHED).fetchall()
        return [_promotion(r) for r in rows]

    def all(self, model_name: str | None = None) -> list[Promotion]:
        query, args = "SELECT * FROM promotions", []
        if model_name is not None:
            query, args = query + " WHERE model_name = ?", [model_name]
        return [_promotion(r) for r in self.db.execute(query + " ORDER BY recorded_at", args).fetchall()]

    def by_version(self, model_name: str, version: str) -> Promotion | None:
        row = self.db.execute("SELECT * FROM promotions WHERE model_name = ? AND version = ?",
                              (model_name, version)).fetchone()
        return _promotion(row) if row else None

    def advance(self, job_id: str, state: str, **fields: object) -> None:
        """Record how far the registration got (`run_id`, `version`, `gate`, `gate_reasons`), clearing its error."""
        columns = {"state": state, "error": None, "updated_at": time.time(), **fields}
        if "gate_reasons" in columns:
            columns["gate_reasons_json"] = json.dumps(columns.pop("gate_reasons"))
        with statedb.immediate(self.db) as db:
            db.execute(f"UPDATE promotions SET {', '.join(f'{k} = ?' for k in columns)} WHERE job_id = ?",
                       [*columns.values(), job_id])

    def set_error(self, job_id: str, error: str) -> None:
        """Why the registration is still pending (the registry down, refused): retried by the next pass."""
        with statedb.immediate(self.db) as db:
            db.execute("UPDATE promotions SET error = ?, updated_at = ? WHERE job_id = ?", (error, time.time(), job_id))

    def record_move(self, model_name: str, version: str, previous: str | None, reason: str) -> None:
        with statedb.immediate(self.db) as db:
            db.execute("INSERT INTO alias_moves (model_name, version, previous_version, reason, at) VALUES (?,?,?,?,?)",
                       (model_name, version, previous, reason, time.time()))

    def moves(self, model_name: str) -> list[AliasMove]:
        rows = self.db.execute("SELECT * FROM alias_moves WHERE model_name = ? ORDER BY id", (model_name,)).fetchall()
        return [AliasMove(r["model_name"], r["version"], r["previous_version"], r["reason"], r["at"]) for r in rows]


def _promotion(row) -> Promotion:
    lineage = Lineage(
        job_id=row["job_id"], attempt_id=row["attempt_id"], job_name=row["job_name"], spec_sha256=row["spec_sha256"],
        bundle_sha256=row["bundle_sha256"], commitment_root=row["commitment_root"], verdict=row["verdict"],
        verdict_id=row["verdict_id"], metrics=json.loads(row["metrics_json"]),
        thresholds=json.loads(row["thresholds_json"]), cost_micro_usd=row["cost_micro_usd"])
    return Promotion(lineage=lineage, model_name=row["model_name"], state=row["state"], run_id=row["run_id"],
                     version=row["version"], gate=row["gate"],
                     gate_reasons=json.loads(row["gate_reasons_json"] or "[]"), error=row["error"],
                     recorded_at=row["recorded_at"], updated_at=row["updated_at"])
