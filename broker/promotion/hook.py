"""What the broker calls: `on_accepted(store, job_id)` when a verdict `accepted` is recorded, and
`retry_pending(store)` from each reconcile pass. Both are idempotent and synchronous (the broker runs them in a
worker thread); a registry that is down or refuses leaves the promotion pending with its error recorded, and
the job accepted."""

from __future__ import annotations

from trainmaster.broker.promotion.config import MlflowSettings, load_registry
from trainmaster.broker.promotion.records import UNFINISHED, Promotion, PromotionStore
from trainmaster.broker.store import Store
from trainmaster.jobs.yamlfile import FileError


def on_accepted(store: Store, job_id: str) -> None:
    """Record the accepted job's lineage, then register and gate it when a registry is configured."""
    from trainmaster.broker.promotion.lineage import lineage_of

    own = Store(store.path)  # its own connection: this runs in a worker thread beside the broker's
    records = PromotionStore(store.path)
    try:
        settings, problem = _settings()
        promotion = records.get(job_id) or records.record(lineage_of(own, job_id),
                                                          pending=settings is not None or problem is not None)
        if promotion.state in UNFINISHED:
            _advance(own, records, promotion, settings, problem)
    finally:
        records.close()
        own.close()


def retry_pending(store: Store) -> None:
    """Carry on every registration an earlier pass left unfinished (nothing when no registry is configured)."""
    settings, problem = _settings()
    if settings is None and problem is None:
        return
    own, records = Store(store.path), PromotionStore(store.path)
    try:
        for promotion in records.unfinished():
            _advance(own, records, promotion, settings, problem)
    finally:
        records.close()
        own.close()


def _settings() -> tuple[MlflowSettings | None, str | None]:
    """The registry settings, or why registry.yaml cannot be used (the promotion then waits for a fix)."""
    try:
        return load_registry(), None
    except FileError as exc:
        return None, str(exc)


def _advance(store: Store, records: PromotionStore, promotion: Promotion, settings: MlflowSettings | None,
             problem: str | None) -> None:
    from trainmaster.backends.base import BackendError
    from trainmaster.broker.promotion.mlflow_registry import RegistryError
    from trainmaster.broker.promotion.registration import register_and_gate
    from trainmaster.broker.filekeeping.shared_outputs import restore_home

    if settings is None:
        records.set_error(promotion.lineage.job_id, problem or "no registry is configured")
        return
    try:  # on a host that did not run the job, its outputs (the artifacts) come from the shared storage first
        restore_home(store, promotion.lineage.job_id, promotion.lineage.attempt_id)
        register_and_gate(store, records, promotion, settings)
    except (RegistryError, BackendError) as exc:
        records.set_error(promotion.lineage.job_id, str(exc))
