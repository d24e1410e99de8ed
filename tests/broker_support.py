"""The async Broker driven from synchronous tests: each call runs to completion on its own event loop
(what the CLI does at its edge), and an async generator (logs) is collected into a list."""

from __future__ import annotations

import asyncio
import inspect


async def _collect(agen) -> list:
    return [item async for item in agen]


class SyncBroker:
    def __init__(self, broker):
        self.inner = broker

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if inspect.iscoroutinefunction(attr):
            return lambda *a, **k: asyncio.run(attr(*a, **k))
        if inspect.isasyncgenfunction(attr):
            return lambda *a, **k: asyncio.run(_collect(attr(*a, **k)))
        return attr


def sync_broker(*args, **kwargs) -> SyncBroker:
    from trainmaster.broker.service import Broker

    return SyncBroker(Broker(*args, **kwargs))


async def reconcile_pass(broker) -> None:
    """One bounded reconcile pass over the home's jobs (broker/daemon/reconciler.py), as any command without a
    daemon runs it first: what brings every unfinished job up to date."""
    import os

    from trainmaster.broker.daemon.leases import Leases
    from trainmaster.broker.daemon.reconciler import Reconciler

    await Reconciler([broker], Leases(broker.store.path), f"test-{os.getpid()}", loops=None).run_pass()
