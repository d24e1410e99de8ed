"""Serve an aiohttp app (a cloud API's local stand-in) on 127.0.0.1, port 0, on its own loop in a daemon thread."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web


class ServedApp:
    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 0, ssl_context=None):
        self.loop, ready, failed = asyncio.new_event_loop(), threading.Event(), []
        self.scheme = "https" if ssl_context is not None else "http"

        async def start() -> None:
            self.runner = web.AppRunner(app, access_log=None)
            await self.runner.setup()
            await web.TCPSite(self.runner, host, port, ssl_context=ssl_context).start()
            self.port = self.runner.addresses[0][1]

        def serve() -> None:
            try:
                self.loop.run_until_complete(start())
            except Exception as exc:  # noqa: BLE001 - reported to the starting thread
                failed.append(exc)
                ready.set()
                return
            ready.set()
            self.loop.run_forever()

        threading.Thread(target=serve, daemon=True, name="served-app").start()
        if not ready.wait(10) or failed:
            raise RuntimeError(f"the local server did not start: {failed}")
        self.url = f"{self.scheme}://{host}:{self.port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
