"""The daemon's long-running tasks, each until `stop` is set (broker/daemon/process.py gathers them): the reconcile
passes (retried with backoff while the database is away), the database probe, the PostgreSQL daemon lock's keeper,
the budget-alert outbox, the job and verdict notifications, the trigger engine, and the configuration watcher with
what a reload puts in force (the brokers' backends.yaml, the trigger engine rebuilt).

A task never ends the daemon on an error: it logs it (rate-limited: broker/daemon/logs.py) and tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from trainmaster.broker import paths

log = logging.getLogger("trainmaster.daemon")

OUTBOX_EVERY_S = 60.0
"""How often pending budget alerts are POSTed again (the outbox gives one up after its MAX_FLUSHES tries)."""
NOTIFY_EVERY_S = 1.0
"""How often job ends and verdicts are looked for, and their notifications POSTed (broker/daemon/notifications.py)."""
PASS_BACKOFF_MAX_S = 30.0
"""The longest wait between passes that fail (the database away): exponential from 0.5 s."""
LOCK_CHECK_S = 5.0
"""How often the PostgreSQL daemon lock is checked (and taken again after the server dropped its session)."""


def trigger_engine(ctx):
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


async def use_backends(ctx, workers) -> None:
    """The backends.yaml in force, given to every broker (`workers`: each with its loop) on its own loop."""
    configs = ctx.config.in_force.backends
    for broker, loop in workers:
        await loop.call(broker.use_backend_configs, configs)


async def reload(ctx, workers) -> bool:
    """Read the configuration files again; when they validate, put them in force (the brokers' backends.yaml, the
    trigger engine rebuilt at its next turn); whether they did."""
    if not await asyncio.to_thread(ctx.config.reload):
        return False
    await use_backends(ctx, workers)
    ctx.triggers_changed.set()
    return True


async def watch_config(ctx, stop: asyncio.Event, hup: asyncio.Event) -> None:
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


async def run_triggers(ctx, stop: asyncio.Event) -> None:
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
            ctx.triggers = trigger_engine(ctx)


async def reconcile(ctx, stop: asyncio.Event, interval: float) -> None:
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


async def watch_database(ctx, stop: asyncio.Event) -> None:
    """Probe the database (a server's: a SQLite file does not go away) every PROBE_S, every second while away."""
    from trainmaster.broker.daemon.database import PROBE_S
    from trainmaster.storage import statedb

    if not statedb.is_server(ctx.database.where):
        return
    while not stop.is_set():
        await asyncio.to_thread(ctx.database.check)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0 if ctx.database.problem else PROBE_S)


async def keep_lock(lock, stop: asyncio.Event) -> None:
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


async def deliver_alerts(stop: asyncio.Event) -> None:
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


async def notify(notes, stop: asyncio.Event) -> None:
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
