"""The state as the renderers read it without a Broker, shared by `calls` and `daemon_calls`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainmaster.broker.store import Store


@dataclass(frozen=True)
class Settled:
    """The state as the renderers read it (`.store`), opened without a Broker."""

    store: Store


def left_out(broker, job_id: str) -> list[str]:
    """What the job's bundle left out as likely secrets, as its `submitted` event records it."""
    return next(((e.detail or {}).get("left_out") or [] for e in broker.store.events(job_id) if e.to_state == "submitted"),
                [])
