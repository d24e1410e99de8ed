"""The daemon process (`python -m trainmaster.broker.daemon`): the API, the reconcile loop, the outbox tasks (budget
alerts; job and verdict notifications), and the trigger engine when `triggers.yaml` names any trigger.
Verifications run in its audit pool (broker/audit_pool.py), stopped with it. Its brokers (the reconciler's
workers and the API's) each run on a WorkerLoop of their own (broker/daemon/worker_loop.py), so their synchronous
database calls never hold up the main loop that serves the API, the triggers and the dashboard.

It listens on 127.0.0.1 (port 0: a free one) or a unix socket, writes its state file once it listens,
and runs reconcile passes every `--interval` seconds. SIGTERM or SIGINT stops it gracefully: no new job
is started, the steps under way finish, their leases are released, the state file is removed. A
`kill -9` loses nothing either: every step is recorded before the next, and the leases it held expire.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import time

from trainmaster.broker import audit_pool, paths
from trainmaster.broker.daemon import allocator, state, token

log = logging.getLogger("trainmaster.daemon")

OUTBOX_EVERY_S = 60.0
"""How often pending budget alerts are POSTed again (the outbox gives one up after its MAX_FLUSHES tries)."""
NOTIFY_EVERY_S = 1.0
"""How often job ends and verdicts are looked for, and their notifications POSTed (broker/daemon/notifications.py)."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trainmaster.broker.daemon")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: a free one)")
    parser.add_argument("--socket", default=None, help="a unix socket path instead of TCP")
    parser.add_argument("--workers", type=int, default=4, help="jobs advanced at once")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between reconcile passes")
    parser.add_argument("--lease-s", type=float, default=None, help="a job lease's time to live (seconds)")
    args = parser.parse_args(argv)
    allocator.cap_arenas()  # before the first thread
    paths.make_private()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(serve(port=args.port, socket_path=args.socket, workers=args.workers, interval=args.interval,
                      lease_s=args.lease_s))


async def serve(*, port: int, socket_path: str | None, workers: int, interval: float, lease_s: float | None) -> None:
    from aiohttp import web

    from trainmaster.broker.daemon.app import make_app
    from trainmaster.broker.daemon.context import DaemonContext
    from trainmaster.broker.daemon.notifications import Notifications
    from trainmaster.broker.daemon.leases import Leases
    from trainmaster.broker.daemon.reconciler import LEASE_S, Reconciler
    from trainmaster.broker.daemon.worker_loop import WorkerLoop
    from trainmaster.broker.service import Broker

    secret = token.ensure_token()
    loops = [WorkerLoop(f"reconciler-{i}") for i in range(workers)]
    api_loop = WorkerLoop("api")
    brokers = [await loop.call(Broker) for loop in loops]  # each made on, and always used on, its own loop
    leases = Leases(paths.state_db())
    notes = Notifications(paths.state_db())  # before any pass: the ends from now on are told of
    reconciler = Reconciler(brokers, leases, f"daemon-{os.getpid()}-{secrets.token_hex(3)}", loops=loops,
                            ttl_s=lease_s or LEASE_S)
    ctx = DaemonContext(token.digest(secret), await api_loop.call(Broker), reconciler, time.time(), api_loop=api_loop)
    ctx.triggers = _trigger_engine(ctx)
    runner = web.AppRunner(make_app(ctx), access_log=None)
    await runner.setup()
    site, ctx.address = _site(web, runner, port, socket_path)
    await site.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    state.write(state.DaemonState(os.getpid(), ctx.address, ctx.started_at))
    log.info("listening on %s", ctx.address)
    tasks = [_reconcile(ctx, stop, interval), _deliver_alerts(stop), _notify(notes, stop)]
    if ctx.triggers is not None:
        tasks.append(ctx.triggers.run(stop))
    try:
        await asyncio.gather(*tasks)
    finally:
        if ctx.triggers is not None:
            ctx.triggers.close()
        await runner.cleanup()
        await asyncio.to_thread(audit_pool.shutdown)  # before the loops' threads end: its workers die with them
        for loop in [*loops, api_loop]:
            await asyncio.to_thread(loop.stop)
        for broker in [*brokers, ctx.api_broker]:
            broker.close()
        leases.close()
        notes.close()
        state.remove(os.getpid())
        log.info("stopped")


def _trigger_engine(ctx):
    """The engine over `triggers.yaml` (submitting through the API's broker, on its loop), None when it names no
    trigger."""
    from trainmaster.broker.daemon.triggers.engine import TriggerEngine
    from trainmaster.broker.daemon.triggers.model import load_triggers
    from trainmaster.broker.daemon.triggers.submitting import broker_gate, broker_submit

    found = load_triggers()
    if not found:
        return None
    log.info("triggers: %s", ", ".join(t.name for t in found))
    submit, gate = broker_submit(ctx.api_broker), broker_gate(ctx.api_broker)

    async def submitted(*args):
        return await ctx.api_loop.submit(submit(*args))

    async def gated(*args):
        return await ctx.api_loop.submit(gate(*args))

    return TriggerEngine(paths.state_db(), found, submitted, gate=gated)


def _site(web, runner, port: int, socket_path: str | None):
    """The listening site and its address (`http://127.0.0.1:PORT` or `unix:PATH`)."""
    if socket_path:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
        return web.UnixSite(runner, socket_path), f"unix:{socket_path}"
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return web.SockSite(runner, sock), f"http://127.0.0.1:{sock.getsockname()[1]}"


async def _reconcile(ctx, stop: asyncio.Event, interval: float) -> None:
    """Passes until `stop`; a pass under way when it is set starts no new job and lets its steps finish."""
    while not stop.is_set():
        result = await ctx.reconciler.run_pass(stopping=stop)
        ctx.passes += 1
        if result.errors:
            log.warning("pass %d: a step failed on %s (recorded on each job)", ctx.passes, ", ".join(result.errors))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)


async def _deliver_alerts(stop: asyncio.Event) -> None:
    """POST the budget alerts still pending in the ledger's outbox, every OUTBOX_EVERY_S seconds."""
    from trainmaster.storage import statedb
    from trainmaster.wallet import outbox

    db = statedb.connect(paths.state_db())
    try:
        while not stop.is_set():
            if await asyncio.to_thread(_has_pending, db, outbox):
                await asyncio.to_thread(outbox.flush, paths.state_db())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), OUTBOX_EVERY_S)
    finally:
        db.close()


async def _notify(notes, stop: asyncio.Event) -> None:
    """Make the notifications of the job ends and verdicts recorded since, and POST them, every NOTIFY_EVERY_S."""
    from trainmaster.broker.daemon.notifications import deliver

    while not stop.is_set():
        try:
            await asyncio.to_thread(notes.collect)
            await deliver(notes)
        except Exception:  # noqa: BLE001 — e.g. an old job's policy file that no longer parses: logged, tried again
            log.exception("notifications failed")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), NOTIFY_EVERY_S)


def _has_pending(db, outbox) -> bool:
    """Whether the outbox holds alerts to deliver (False while the ledger has made no table yet)."""
    from trainmaster.storage import statedb

    try:
        return outbox.has_pending(db)
    except statedb.OperationalError:
        return False
