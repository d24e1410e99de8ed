"""What the daemon's request handlers share, kept on the aiohttp application under `CTX`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web

from trainmaster.broker.daemon.worker_loop import WorkerLoop

T = TypeVar("T")


@dataclass
class DaemonContext:
    """What the handlers share: the token's sha256, the API's broker (and its loop), the reconciler, and facts for
    /health."""

    token_digest: str
    api_broker: object
    reconciler: object
    started_at: float
    address: str = ""
    passes: int = 0
    triggers: object | None = None
    """The trigger engine (broker/daemon/triggers/), when `triggers.yaml` names any trigger."""
    api_loop: WorkerLoop | None = None
    """The loop the API's broker was made on and runs on (broker/daemon/worker_loop.py), off the main loop."""
    roots: Any = None
    """The folders requests may name files under (broker/daemon/roots.py)."""
    database: Any = None
    """Whether the database answers (broker/daemon/database.py `Watch`)."""
    config: Any = None
    """The configuration in force and the files' problems (broker/daemon/config_watch.py)."""
    guard: Any = None
    """The connection limit (broker/daemon/server.py `Guard`)."""
    triggers_changed: Any = None
    """Set (an asyncio.Event) when a reload changed the configuration: the trigger engine is rebuilt."""
    reload: Callable[[], Awaitable[bool]] | None = None
    """Read the configuration files again (SIGHUP, `daemon reload`): whether a new set is in force."""

    def problems(self) -> list[str]:
        """What degrades the daemon now: the database away, configuration files that do not validate."""
        return [*(self.database.status() if self.database else []), *(self.config.status() if self.config else [])]

    def connections(self) -> dict:
        """The API's connections: open now, the limit, and how many were closed idle or refused at the limit."""
        if self.guard is None:
            return {}
        return {"open": len(self.guard.server.connections), "limit": self.guard.limit,
                "closed_idle": self.guard.evicted, "refused": self.guard.refused}

    def on_api_broker(self, work: Callable[[Any], Coroutine[Any, Any, T]]) -> Awaitable[T]:
        """`work(api_broker)` run on the API broker's loop: its database calls never hold the main loop up."""
        return self.api_loop.submit(work(self.api_broker))

    def budgets(self) -> list:
        """The budgets in force: the default policy's (for /metrics and the dashboard)."""
        from trainmaster.broker.policy import load_policy

        try:
            return list(load_policy("default").budgets)
        except Exception:  # noqa: BLE001 — a policy file being edited: no budgets shown, the scrape goes on
            return []

    def trigger_lags(self) -> dict[str, float]:
        """Seconds each scheduled trigger is behind its due slot (0 when served); empty without triggers."""
        import time

        return self.triggers.lags(time.time()) if self.triggers is not None else {}


CTX = web.AppKey("ctx", DaemonContext)
