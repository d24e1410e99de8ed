"""What a person does to the `production` alias (`trainmaster models promote|rollback`): each move is made in
the registry and recorded, with why. A promotion by hand skips the gate (it is the operator's call); a rollback
points production back to the version it held before the current one."""

from __future__ import annotations

from trainmaster.broker.promotion.config import MlflowSettings, load_registry
from trainmaster.broker.promotion.records import Promotion, PromotionStore
from trainmaster.broker.store import Store


class PromotionError(ValueError):
    """The promotion or rollback asked for cannot be made (no registry, no such version, nothing to go back to)."""


def production(records: PromotionStore, model: str) -> str | None:
    """The production version as last recorded (moves by the gate, by hand and by rollback)."""
    moves = records.moves(model)
    return moves[-1].version if moves else None


def only_model(records: PromotionStore, model: str | None) -> str:
    """`model`, or the one model promotions were registered into; PromotionError when that is ambiguous."""
    if model:
        return model
    names = sorted({p.model_name for p in records.all() if p.model_name})
    if len(names) != 1:
        raise PromotionError(f"name the model: {', '.join(names)}" if names else "no model has been registered yet")
    return names[0]


def promote(store: Store, ref: str, model: str | None = None) -> tuple[str, str]:
    """Point production at a version (a number, of `model`) or at a job's version (its id or a prefix), registering
    the job first when its registration is still pending; returns (model, version)."""
    settings = _settings()
    records = PromotionStore(store.path)
    try:
        if ref.isdigit():
            model, version = only_model(records, model), ref
            if records.by_version(model, version) is None:
                raise PromotionError(f"{model} has no version {version} registered by trainmaster")
        else:
            promotion = _registered(store, records, store.find_job(ref).id)
            model, version = promotion.model_name, promotion.version
        _move(records, settings, model, version, "promoted by hand")
        return model, version
    finally:
        records.close()


def rollback(store: Store, model: str | None = None) -> tuple[str, str]:
    """Point production back at the version it held before the current one; returns (model, version)."""
    settings = _settings()
    records = PromotionStore(store.path)
    try:
        model = only_model(records, model)
        moves = records.moves(model)
        if not moves or moves[-1].previous_version is None:
            raise PromotionError(f"{model} has no earlier production version to roll back to")
        _move(records, settings, model, moves[-1].previous_version, f"rollback from version {moves[-1].version}")
        return model, moves[-1].previous_version
    finally:
        records.close()


def _settings() -> MlflowSettings:
    settings = load_registry()
    if settings is None:
        raise PromotionError("no model registry is configured (an `mlflow:` section in registry.yaml)")
    return settings


def _registered(store: Store, records: PromotionStore, job_id: str) -> Promotion:
    from trainmaster.broker.promotion.hook import on_accepted

    on_accepted(store, job_id)  # records and registers it if no pass has yet (idempotent)
    promotion = records.get(job_id)
    if promotion is None or promotion.version is None:
        why = promotion.error if promotion else "it was never accepted"
        raise PromotionError(f"job {job_id} has no registered version: {why}")
    return promotion


def _move(records: PromotionStore, settings: MlflowSettings, model: str, version: str, reason: str) -> None:
    from trainmaster.broker.promotion.mlflow_registry import MlflowRegistry

    MlflowRegistry(settings).set_production(model, version)
    records.record_move(model, version, production(records, model), reason)
