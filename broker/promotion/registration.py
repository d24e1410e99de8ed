"""One promotion carried from where its record says it stopped: the MLflow run (metrics, model files), the
model version (lineage tags), then the gate, which moves the `production` alias only when it passes. Each step
is recorded before the next, and each looks up by the job id tag first, so a crash anywhere resumes without
registering twice (mlflow_registry.py)."""

from __future__ import annotations

from trainmaster.broker.promotion.config import MlflowSettings
from trainmaster.broker.promotion.gate import gate_failures
from trainmaster.broker.promotion.lineage import model_files
from trainmaster.broker.promotion.mlflow_registry import MlflowRegistry
from trainmaster.broker.promotion.records import Promotion, PromotionStore
from trainmaster.broker.store import Store


def register_and_gate(store: Store, records: PromotionStore, promotion: Promotion, settings: MlflowSettings) -> None:
    lineage, job_id = promotion.lineage, promotion.lineage.job_id
    model = promotion.model_name or settings.model_name(lineage.job_name)
    registry = MlflowRegistry(settings)
    run_id, version = promotion.run_id, promotion.version
    if promotion.state == "pending":
        run_id = registry.logged_run(model, lineage, lineage.metrics, model_files(store, lineage))
        records.advance(job_id, "run", run_id=run_id, model_name=model)
    if promotion.state in ("pending", "run"):
        version = registry.version_of(model, lineage, run_id)
        records.advance(job_id, "registered", version=version)
    failures = gate(registry, records, model, version, lineage.metrics, lineage.thresholds)
    records.advance(job_id, "done", gate="failed" if failures else "passed", gate_reasons=failures)


def gate(registry: MlflowRegistry, records: PromotionStore, model: str, version: str,
         metrics: dict[str, float], thresholds: dict[str, float]) -> list[str]:
    """Compare the version with production; move the alias (and record the move) when it passes."""
    production = registry.production(model)
    if production is not None and production.version == version:
        failures = []  # moved by a pass that died before recording it
    else:
        failures = gate_failures(metrics, thresholds, production.metrics if production else None,
                                 production.version if production else None)
        if not failures:
            registry.set_production(model, version)
    if not failures:
        record_move(records, model, version, production.version if production and production.version != version
                    else None, "the promotion gate passed")
    return failures


def record_move(records: PromotionStore, model: str, version: str, previous: str | None, reason: str) -> None:
    """Record that production now points to `version` (once: a retry after a crash finds it recorded)."""
    moves = records.moves(model)
    if moves and moves[-1].version == version:
        return
    records.record_move(model, version, previous if previous is not None else (moves[-1].version if moves else None),
                        reason)
