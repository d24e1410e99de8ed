"""An event loop on a thread of its own, for the daemon's brokers: their synchronous database calls block that
thread, never the daemon's main loop (the API, the triggers, the dashboard) nor another worker.

`WorkerLoop.submit(coro)` runs a coroutine on the worker's loop and returns an awaitable for the caller's loop;
cancelling that awaitable cancels the coroutine. `call(fn, *args)` runs a plain function there (an object made
and used on that loop only: a Broker, whose aiohttp sessions, segment channel and job-lock sessions belong to it).
`stop()` cancels what still runs, waits for it, closes the loop and joins the thread.

The audit pool's worker processes die with the thread that started them (their parent-death signal,
broker/audit_pool.py), so the pool is shut down before the worker loops are stopped.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class WorkerLoop:
    """A thread running its own event loop until `stop()`."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Awaitable[T]:
        """`coro` run on this loop; the result is awaited on the caller's (running) loop."""
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def call(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]:
        """`fn(*args)` run on this loop's thread."""
        async def called() -> T:
            return fn(*args)

        return self.submit(called())

    def stop(self) -> None:
        """Cancel the coroutines still running here, let them finish their cleanup, close the loop; blocking."""
        if self.loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._cancel_all(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def _cancel_all(self) -> None:
        running = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await self.loop.shutdown_asyncgens()
        await self.loop.shutdown_default_executor()
