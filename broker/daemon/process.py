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
from trainmaster.broker.daemon import allocator, logs, private, runs, state_file, tasks, token

log = logging.getLogger("trainmaster.daemon")

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
    private.not_dumpable()  # its environment (the database's password) unreadable by jobs of the same user
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
    await tasks.use_backends(ctx, workers)
    ctx.triggers = tasks.trigger_engine(ctx)
    ctx.reload = functools.partial(tasks.reload, ctx, workers)
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
    state_file.write(state_file.mine(ctx.address, ctx.started_at))
    await asyncio.to_thread(lock.announce, ctx.address)
    runs.record(runs.RUNNING, address=ctx.address, started_at=started_at)
    log.info("listening on %s (at most %d connections; roots: %s)", ctx.address, limit, ctx.roots)
    running = [tasks.reconcile(ctx, stop, args.interval), tasks.deliver_alerts(stop), tasks.notify(notes, stop),
               tasks.run_triggers(ctx, stop), tasks.watch_config(ctx, stop, hup), tasks.watch_database(ctx, stop),
               tasks.keep_lock(lock, stop)]
    try:
        await asyncio.gather(*running)
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
        state_file.remove(os.getpid())
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

