"""The daemon process (`python -m trainmaster.broker.daemon`): the API, the reconcile loop, the outbox tasks (budget
alerts; job and verdict notifications), and the trigger engine when `triggers.yaml` names any trigger.
Verifications run in its audit pool (broker/audit_pool.py), stopped with it. Its brokers (the reconciler's
workers and the API's) each run on a WorkerLoop of their own (broker/daemon/worker_loop.py), so their synchronous
database calls never hold up the main loop that serves the API, the triggers and the dashboard.

Starting, in order: the configuration files are read and validated (config_watch.py: a bad file fails the start
with its `file:line` message); the database is waited for, with backoff, up to `--db-wait-s` (database.py); the
state's daemon lock is taken (instance.py: a second daemon on the same state fails at once, naming the first);
then the API listens (server.py: timeouts, a connection limit under the file limit) and the state file is written.
Each phase is written to the daemon's run file (runs.py), which `daemon start` follows.

Running: passes every `--interval` seconds; a pass that fails (the database away) is retried with exponential
backoff while `/v1/health` says `degraded`; the configuration files are watched and re-read (and on SIGHUP);
on PostgreSQL the daemon lock is checked and taken again after the server restarted. SIGTERM or SIGINT stops it
gracefully: no new job is started, the steps under way finish, their leases are released, the state file is
removed. A `kill -9` loses nothing either: every step is recorded before the next, and the leases it held expire.

Exit status: 0 stopped, 2 could not start (the run file says why), 3 another daemon holds the state.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import secrets
import signal
import socket
import sys
import time
from pathlib import Path

from trainmaster.broker import audit_pool, paths
from trainmaster.broker.daemon import allocator, logs, runs, state, token

log = logging.getLogger("trainmaster.daemon")

OUTBOX_EVERY_S = 60.0
"""How often pending budget alerts are POSTed again (the outbox gives one up after its MAX_FLUSHES tries)."""
NOTIFY_EVERY_S = 1.0
"""How often job ends and verdicts are looked for, and their notifications POSTed (broker/daemon/notifications.py)."""
PASS_BACKOFF_MAX_S = 30.0
"""The longest wait between passes that fail (the database away): exponential from 0.5 s."""
LOCK_CHECK_S = 5.0
"""How often the PostgreSQL daemon lock is checked (and taken again after the server dropped its session)."""
EXIT_FAILED, EXIT_HELD = 2, 3


class StartFailed(RuntimeError):
    """The daemon cannot start; the message says why (and what to fix)."""


def parse(argv: list[str] | None) -> argparse.Namespace:
    from trainmaster.broker.daemon.database import START_WAIT_S
    from trainmaster.broker.daemon.server import MAX_CONNECTIONS

    parser = argparse.ArgumentParser(prog="python -m trainmaster.broker.daemon")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: a free one)")
    parser.add_argument("--socket", default=None, help="a unix socket path instead of TCP")
    parser.add_argument("--workers", type=int, default=4, help="jobs advanced at once")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between reconcile passes")
    parser.add_argument("--lease-s", type=float, default=None, help="a job lease's time to live (seconds)")
    parser.add_argument("--root", action="append", default=None, help="a folder requests may name files under")
    parser.add_argument("--db-wait-s", type=float, default=START_WAIT_S, help="how long to wait for the database")
    parser.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS, help="client connections at most")
    parser.add_argument("--log-file", default=None, help="log to this file, rotated by size (default: stderr)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the daemon until it is stopped; its exit status (the process exits with it when run as a module)."""
    args = parse(argv)
    started_at = time.time()
    allocator.cap_arenas()  # before the first thread
    paths.make_private()
    os.environ[paths.HOME_ENV] = str(paths.home())  # absolute: the daemon runs in / (it never reads its own folder)
    logs.setup(Path(args.log_file) if args.log_file else None)
    runs.record(runs.STARTING, started_at=started_at)
    os.chdir("/")
    try:
        asyncio.run(serve(args, started_at))
    except StartFailed as exc:
        held = isinstance(exc, Held)
        runs.record(runs.HELD if held else runs.FAILED, str(exc), started_at=started_at)
        log.error("%s", exc)
        print(f"{'already running: ' if held else ''}{exc}", file=sys.stderr)
        return EXIT_HELD if held else EXIT_FAILED
    runs.remove()
    return 0


class Held(StartFailed):
    """Another daemon holds the state."""


async def serve(args: argparse.Namespace, started_at: float) -> None:
    from aiohttp import web

    from trainmaster.broker.daemon.app import make_app
    from trainmaster.broker.daemon.context import DaemonContext
    from trainmaster.broker.daemon.database import Watch
    from trainmaster.broker.daemon.leases import Leases
    from trainmaster.broker.daemon.notifications import Notifications
    from trainmaster.broker.daemon.reconciler import LEASE_S, Reconciler
    from trainmaster.broker.daemon.roots import Roots
    from trainmaster.broker.daemon.server import Guard, GuardedSite, connection_limit, handler_args, raise_file_limit
    from trainmaster.broker.daemon.worker_loop import WorkerLoop
    from trainmaster.broker.service import Broker

    where = paths.state_db()
    config, lock = await asyncio.to_thread(_prepared, where, args.db_wait_s, started_at)
    loops: list[WorkerLoop] = []
    try:
        secret = token.ensure_token()
        loops = [WorkerLoop(f"reconciler-{i}") for i in range(args.workers)]
        api_loop = WorkerLoop("api")
        brokers = [await loop.call(Broker) for loop in loops]  # each made on, and always used on, its own loop
        leases = Leases(where)
        notes = Notifications(where)  # before any pass: the ends from now on are told of
    except Exception as exc:  # noqa: BLE001 — the database went away again, a schema too new: said, not raised
        lock.release()
        for loop in loops:
            loop.stop()
        raise StartFailed(f"the daemon could not open its state ({_shown(where)}): {exc}") from None
    reconciler = Reconciler(brokers, leases, f"daemon-{os.getpid()}-{secrets.token_hex(3)}", loops=loops,
                            ttl_s=args.lease_s or LEASE_S)
    ctx = DaemonContext(token.digest(secret), await api_loop.call(Broker), reconciler, time.time(), api_loop=api_loop,
                        roots=Roots(args.root), database=Watch(where), config=config)
    ctx.triggers_changed = asyncio.Event()
    workers = [*zip(brokers, loops), (ctx.api_broker, api_loop)]
    await _use_backends(ctx, workers)
    ctx.triggers = _trigger_engine(ctx)
    ctx.reload = functools.partial(_reload, ctx, workers)
    busy: set = set()
    limit = connection_limit(raise_file_limit(), args.max_connections)
    runner = web.AppRunner(make_app(ctx, busy), **handler_args())
    await runner.setup()
    sock, ctx.address = _socket(args.port, args.socket)
    ctx.guard = Guard(runner.server, limit, busy)
    site = GuardedSite(runner, sock, ctx.guard)
    await site.start()
    stop, hup = asyncio.Event(), asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, hup.set)
    state.write(state.DaemonState(os.getpid(), ctx.address, ctx.started_at))
    await asyncio.to_thread(lock.announce, ctx.address)
    runs.record(runs.RUNNING, address=ctx.address, started_at=started_at)
    log.info("listening on %s (at most %d connections; roots: %s)", ctx.address, limit, ctx.roots)
    tasks = [_reconcile(ctx, stop, args.interval), _deliver_alerts(stop), _notify(notes, stop),
             _run_triggers(ctx, stop), _watch_config(ctx, stop, hup), _watch_database(ctx, stop),
             _keep_lock(lock, stop)]
    try:
        await asyncio.gather(*tasks)
    finally:
        runs.record(runs.STOPPING, address=ctx.address, started_at=started_at)
        if ctx.triggers is not None:
            ctx.triggers.close()
        await runner.cleanup()
        await asyncio.to_thread(audit_pool.shutdown)  # before the loops' threads end: its workers die with them
        for loop in [*loops, api_loop]:
            await asyncio.to_thread(loop.stop)
        for broker in [*brokers, ctx.api_broker]:
            with contextlib.suppress(Exception):
                broker.close()
        for part in (leases, notes, ctx.database):
            with contextlib.suppress(Exception):
                part.close()
        state.remove(os.getpid())
        lock.release()
        log.info("stopped")


def _shown(where) -> str:
    from trainmaster.storage import statedb

    return statedb.shown(where)


def _prepared(where, db_wait_s: float, started_at: float):
    """The configuration (validated), the database (waited for) and the state's daemon lock (taken), in that order;
    `StartFailed` (or `Held`) saying why not. Blocking: run off the event loop."""
    from trainmaster.broker.daemon.config_watch import Configuration
    from trainmaster.broker.daemon.database import DatabaseAway, wait_for
    from trainmaster.broker.daemon.instance import Held as LockHeld
    from trainmaster.broker.daemon.instance import InstanceLock
    from trainmaster.jobs.yamlfile import FileError
    from trainmaster.storage import statedb

    config = Configuration(paths.config_dir())
    try:
        config.start()
    except FileError as exc:
        raise StartFailed("a configuration file does not validate; fix it and start again:\n"
                          + "\n".join(exc.problems)) from None
    if statedb.is_server(where):
        try:
            wait_for(where, db_wait_s, lambda why: runs.record(runs.WAITING, why, started_at=started_at))
        except DatabaseAway as exc:
            raise StartFailed(str(exc)) from None
    lock = InstanceLock(where)
    try:
        lock.take()
    except LockHeld as exc:
        raise Held(str(exc)) from None
    except statedb.Error as exc:
        raise StartFailed(f"the daemon could not take its lock on the state ({_shown(where)}): {exc}") from None
    return config, lock


def _trigger_engine(ctx):
    """The engine over the triggers in force (submitting through the API's broker, on its loop), None when there
    is no trigger."""
    from trainmaster.broker.daemon.triggers.engine import TriggerEngine
    from trainmaster.broker.daemon.triggers.submitting import broker_gate, broker_submit

    found = ctx.config.in_force.triggers if ctx.config and ctx.config.in_force else []
    if not found:
        return None
    log.info("triggers: %s", ", ".join(t.name for t in found))
    submit, gate = broker_submit(ctx.api_broker), broker_gate(ctx.api_broker)

    async def submitted(*args):
        return await ctx.api_loop.submit(submit(*args))

    async def gated(*args):
        return await ctx.api_loop.submit(gate(*args))

    return TriggerEngine(paths.state_db(), found, submitted, gate=gated, configs=ctx.config.in_force.backends)


async def _use_backends(ctx, workers) -> None:
    """The backends.yaml in force, given to every broker (`workers`: each with its loop) on its own loop."""
    configs = ctx.config.in_force.backends
    for broker, loop in workers:
        await loop.call(broker.use_backend_configs, configs)


async def _reload(ctx, workers) -> bool:
    """Read the configuration files again; when they validate, put them in force (the brokers' backends.yaml, the
    trigger engine rebuilt at its next turn); whether they did."""
    if not await asyncio.to_thread(ctx.config.reload):
        return False
    await _use_backends(ctx, workers)
    ctx.triggers_changed.set()
    return True


async def _watch_config(ctx, stop: asyncio.Event, hup: asyncio.Event) -> None:
    """Re-read the configuration when its files change (looked at every WATCH_S) or on SIGHUP."""
    from trainmaster.broker.daemon.config_watch import WATCH_S

    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(_first(stop, hup), WATCH_S)
        if stop.is_set():
            return
        try:
            if hup.is_set() or await asyncio.to_thread(ctx.config.changed):
                hup.clear()
                await ctx.reload()
        except Exception:  # noqa: BLE001 — never ends the daemon; logged (rate-limited)
            log.exception("reading the configuration again failed")


async def _first(*events: asyncio.Event) -> None:
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def _run_triggers(ctx, stop: asyncio.Event) -> None:
    """The trigger engine's ticks; a reload that changed the triggers rebuilds the engine between ticks."""
    while not stop.is_set():
        engine, ended = ctx.triggers, asyncio.Event()
        runner = asyncio.create_task(engine.run(ended)) if engine is not None else None
        await _first(stop, ctx.triggers_changed)
        ended.set()
        if runner is not None:
            await runner
        if ctx.triggers_changed.is_set() and not stop.is_set():
            ctx.triggers_changed.clear()
            if engine is not None:
                engine.close()
            ctx.triggers = _trigger_engine(ctx)


def _socket(port: int, socket_path: str | None) -> tuple[socket.socket, str]:
    """The bound listening socket and its address (`http://127.0.0.1:PORT` or `unix:PATH`)."""
    if socket_path:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(socket_path)
        return sock, f"unix:{socket_path}"
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


async def _reconcile(ctx, stop: asyncio.Event, interval: float) -> None:
    """Passes until `stop`; a pass under way when it is set starts no new job and lets its steps finish. A pass
    that fails (the database away) is tried again with exponential backoff (tenacity), up to PASS_BACKOFF_MAX_S
    apart, until one succeeds: the next pass carries on from what the database recorded."""
    from tenacity import AsyncRetrying, retry_if_exception, wait_exponential

    async def sleep(seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)

    def failed(retry_state) -> None:
        from trainmaster.storage import statedb

        exc = retry_state.outcome.exception()
        if isinstance(exc, statedb.Error):
            ctx.database.failed(exc)
        log.warning("a reconcile pass failed (%s: %s); trying again in %.1f s", type(exc).__name__, exc,
                    retry_state.next_action.sleep if retry_state.next_action else 0)

    while not stop.is_set():
        try:
            async for attempt in AsyncRetrying(wait=wait_exponential(multiplier=0.5, max=PASS_BACKOFF_MAX_S),
                                               retry=retry_if_exception(lambda e: not stop.is_set()), sleep=sleep,
                                               before_sleep=failed, reraise=True):
                with attempt:
                    result = await ctx.reconciler.run_pass(stopping=stop)
        except Exception:  # noqa: BLE001 — only while stopping: the pass is not tried again
            return
        if ctx.database.problem is not None:
            await asyncio.to_thread(ctx.database.check)  # a pass went through: say so once the probe agrees
        ctx.passes += 1
        if result.errors:
            log.warning("pass %d: a step failed on %s (recorded on each job)", ctx.passes, ", ".join(result.errors))
        await sleep(interval)


async def _watch_database(ctx, stop: asyncio.Event) -> None:
    """Probe the database (a server's: a SQLite file does not go away) every PROBE_S, every second while away."""
    from trainmaster.broker.daemon.database import PROBE_S
    from trainmaster.storage import statedb

    if not statedb.is_server(ctx.database.where):
        return
    while not stop.is_set():
        await asyncio.to_thread(ctx.database.check)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0 if ctx.database.problem else PROBE_S)


async def _keep_lock(lock, stop: asyncio.Event) -> None:
    """On PostgreSQL, check the daemon lock every LOCK_CHECK_S and take it again when the server dropped it; stop
    the daemon when another one took the state meanwhile."""
    from trainmaster.storage import statedb

    if not statedb.is_server(lock.where):
        return
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), LOCK_CHECK_S)
        if stop.is_set():
            return
        try:
            held = await asyncio.to_thread(lock.still_held)
        except statedb.Error:
            continue  # the database is away: checked again when it is back
        if not held:
            log.error("another daemon took this state while the database was away; stopping")
            stop.set()


async def _deliver_alerts(stop: asyncio.Event) -> None:
    """POST the budget alerts still pending in the ledger's outbox, every OUTBOX_EVERY_S seconds."""
    from trainmaster.storage import statedb
    from trainmaster.wallet import outbox

    db = None
    try:
        while not stop.is_set():
            try:
                db = db or statedb.connect(paths.state_db())
                if await asyncio.to_thread(_has_pending, db, outbox):
                    await asyncio.to_thread(outbox.flush, paths.state_db())
            except Exception:  # noqa: BLE001 — the database away: tried again at the next turn
                log.warning("budget alerts could not be delivered now; trying again in %.0f s", OUTBOX_EVERY_S)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), OUTBOX_EVERY_S)
    finally:
        if db is not None:
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
