"""What the broker calls: `on_accepted(store, job_id)` when a verdict `accepted` is recorded, and
`retry_pending(store)` from each reconcile pass. Both are idempotent and synchronous (the broker runs them in a
worker thread); a registry that is down or refuses leaves the promotion pending with its error recorded, and
the job accepted."""

from __future__ import annotations

import logging
import time

from trainmaster.broker.promotion.config import MlflowSettings, load_registry
from trainmaster.broker.promotion.records import UNFINISHED, Promotion, PromotionStore
from trainmaster.broker.store import Store
from trainmaster.jobs.yamlfile import FileError

log = logging.getLogger("trainmaster.promotion")
DOWN_RETRY_S = 120.0
"""How long a registry found down is left alone before a promotion waiting on it is tried again."""
_said_down: set[str] = set()


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


def retry_pending(store: Store, now: float | None = None) -> None:
    """Carry on every registration an earlier pass left unfinished (nothing when no registry is configured). A
    registry found down is not asked again for DOWN_RETRY_S (unless its address changed): every later command
    would otherwise wait on it, each for its timeout."""
    settings, problem = _settings()
    if settings is None and problem is None:
        return
    own, records = Store(store.path), PromotionStore(store.path)
    now = time.time() if now is None else now
    try:
        for promotion in records.unfinished():
            if settings is not None and _recently_down(promotion, settings, now):
                continue
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
    from trainmaster.broker.shared_outputs import restore_home

    if settings is None:
        records.set_error(promotion.lineage.job_id, problem or "no registry is configured")
        return
    try:  # on a host that did not run the job, its outputs (the artifacts) come from the shared storage first
        restore_home(store, promotion.lineage.job_id, promotion.lineage.attempt_id)
        register_and_gate(store, records, promotion, settings)
    except (RegistryError, BackendError) as exc:
        records.set_error(promotion.lineage.job_id, str(exc))
        if isinstance(exc, RegistryError) and settings.tracking_uri not in _said_down:
            _said_down.add(settings.tracking_uri)  # one line per command: what is down, and what waits for it
            log.warning("the model registry is down (%s): the promotion of %s waits, and is tried again after %s "
                        "(`trainmaster models ls`)", exc, promotion.lineage.job_id,
                        time.strftime("%H:%M:%S", time.localtime(time.time() + DOWN_RETRY_S)))


def _recently_down(promotion: Promotion, settings: MlflowSettings, now: float) -> bool:
    """Whether the promotion's last try found this very registry down less than DOWN_RETRY_S ago."""
    return (promotion.error is not None and f"MLflow at {settings.tracking_uri}," in promotion.error
            and now - promotion.updated_at < DOWN_RETRY_S)
