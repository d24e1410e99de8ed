"""What the daemon's request handlers share, kept on the aiohttp application under `CTX`."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web


@dataclass
class DaemonContext:
    """What the handlers share: the token's sha256, the API's broker, the reconciler, and facts for /health."""

    token_digest: str
    api_broker: object
    reconciler: object
    started_at: float
    address: str = ""
    passes: int = 0
    triggers: object | None = None
    """The trigger engine (broker/daemon/triggers/), when `triggers.yaml` names any trigger."""

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
