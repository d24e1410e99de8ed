"""The trigger engine: each tick decides which triggers fire, records each fire, then submits its job.

A trigger fires when its cron schedule has a slot due since its last fire (missed slots count once), or when
its data threshold is reached against the cursor of its last accepted run; never while its last job has not
ended, never within `debounce_s` of its last fire, never while the policy's budgets would refuse the run.

Exactly once across crashes: the fire (its idempotency key, the slot, the data cursor seen) is recorded in
`state.db` before the submit, and the job id after it. A fire found recorded without a job is submitted again
at the next tick, through `submit(spec_path, policy, reason, key)`, which must be idempotent on `key` (the
broker's adapter, `submitting.py`, returns the job an earlier call made). A fire whose job is accepted makes
its cursor the trigger's baseline; a failed, cancelled or never-submitted run leaves its data counted again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from trainmaster.broker import states
from trainmaster.broker.store import NotFound, Store

from .model import Trigger
from .records import Fire, Records
from .sources import Observation, SourceUnavailable, observe

log = logging.getLogger(__name__)

Submit = Callable[[Path, str, str, str], Awaitable[str]]
"""submit(spec_path, policy, reason, key) -> job id; idempotent on key."""
Gate = Callable[[Path, str], Awaitable[str | None]]
"""gate(spec_path, policy) -> why the budgets would refuse the run now, or None."""

TICK_S = 5.0


@dataclass(frozen=True)
class Fired:
    trigger: str
    key: str
    reason: str
    job_id: str | None
    error: str | None = None
    """Why the submit refused the run (the fire has ended; the data counts again at the next tick)."""


class TriggerRefused(RuntimeError):
    """A manual fire that cannot happen now (an unknown trigger, its last run unfinished, a budget)."""


@dataclass(frozen=True)
class _Decision:
    reason: str
    slot: float | None
    observation: Observation | None


class TriggerEngine:
    def __init__(self, store_path: Path, triggers: list[Trigger], submit: Submit,
                 clock: Callable[[], float] = time.time, *, gate: Gate | None = None,
                 configs: Mapping[str, Any] | None = None):
        self.triggers = {t.name: t for t in triggers}
        self.submit, self.clock, self.gate = submit, clock, gate
        self.records = Records(store_path)
        self.store = Store(store_path)
        self._configs = configs
        self.problems: dict[str, str] = {}
        """Why each trigger did not fire at its last tick, when something stood in its way (a budget, a source)."""

    def close(self) -> None:
        self.records.close()
        self.store.close()

    async def run(self, stop: asyncio.Event, clock: Callable[[], float] | None = None, interval_s: float = TICK_S) -> None:
        """Tick every `interval_s` until `stop` is set; a tick's error is logged, never ends the loop."""
        clock = clock or self.clock
        while not stop.is_set():
            try:
                await self.tick(clock())
            except Exception:
                log.exception("trigger tick failed")
            try:
                await asyncio.wait_for(stop.wait(), interval_s)
            except TimeoutError:
                pass

    async def tick(self, now: float) -> list[Fired]:
        """Submit the fires left pending by a crash, then fire each trigger that is due."""
        fired = [await self._submit(fire) for fire in await asyncio.to_thread(self.records.pending)]
        for trigger in self.triggers.values():
            if trigger.manual or not await asyncio.to_thread(self._idle, trigger, now):
                continue
            decision = await self._due(trigger, now)
            if decision is not None and await self._allowed(trigger):
                fired += await self._fire(trigger, decision, now)
        return fired

    async def fire(self, name: str) -> Fired:
        """Fire `name` now, whatever its schedule and data (debounce aside); TriggerRefused when it cannot."""
        trigger = self.triggers.get(name)
        if trigger is None:
            raise TriggerRefused(f"no trigger {name!r}; known: {', '.join(sorted(self.triggers)) or 'none'}")
        now = self.clock()
        if not await asyncio.to_thread(self._ended, trigger, now):
            raise TriggerRefused(f"trigger {name!r}: its last run has not ended")
        observation = await self._observe(trigger) if trigger.data else None
        if not await self._allowed(trigger):
            raise TriggerRefused(f"trigger {name!r}: {self.problems[name]}")
        fired = await self._fire(trigger, _Decision("manual", None, observation), now)
        if not fired:
            raise TriggerRefused(f"trigger {name!r} was fired by another process at the same moment")
        return fired[0]

    def lags(self, now: float) -> dict[str, float]:
        """Seconds each scheduled trigger is behind: since its due slot when no fire served it yet, else 0 (for
        /metrics; blocking, called off the event loop)."""
        lags = {}
        for trigger in self.triggers.values():
            if trigger.schedule and not trigger.manual:
                slot = self._due_slot(trigger, now)
                lags[trigger.name] = max(0.0, now - slot) if slot is not None else 0.0
        return lags

    # deciding

    def _idle(self, trigger: Trigger, now: float) -> bool:
        """The last run has ended (recording an accepted one's cursor as the baseline) and debounce has passed."""
        if not self._ended(trigger, now):
            return False
        last = self.records.last(trigger.name)
        return last is None or now - last.fired_at >= trigger.debounce_s

    def _ended(self, trigger: Trigger, now: float) -> bool:
        last = self.records.last(trigger.name)
        if last is None or last.error is not None:
            return True
        if last.job_id is None:
            return False  # recorded, its submit still to happen
        state = self._job_state(last.job_id)
        if state == "accepted" and last.cursor is not None and self._newer_than_baseline(last):
            self.records.accept(last, now)
        return state in states.JOB_ENDS or state is None

    def _newer_than_baseline(self, fire: Fire) -> bool:
        base = self.records.baseline(fire.trigger)
        return base is None or base[0] < fire.id

    def _job_state(self, job_id: str) -> str | None:
        try:
            return self.store.job(job_id).state
        except NotFound:
            return None  # removed since: it holds nothing back

    async def _due(self, trigger: Trigger, now: float) -> _Decision | None:
        slot = await asyncio.to_thread(self._due_slot, trigger, now) if trigger.schedule else None
        observation = await self._observe(trigger) if trigger.data else None
        if observation is not None and observation.new >= trigger.data.min_new:
            return _Decision(f"data: {observation.new} new since the last accepted run", slot, observation)
        if slot is not None:
            return _Decision(f"schedule {trigger.schedule!r}: {_when(slot, trigger.timezone)}", slot, observation)
        return None

    def _due_slot(self, trigger: Trigger, now: float) -> float | None:
        """The latest schedule slot at or before `now` when no fire served it yet (missed slots count once)."""
        from croniter import croniter

        after = datetime.fromtimestamp(int(now) + 1, ZoneInfo(trigger.timezone))  # get_prev is strictly before
        slot = croniter(trigger.schedule, after).get_prev(datetime).timestamp()
        served = self.records.last_slot(trigger.name)
        since = served if served is not None else self.records.started(trigger.name, now)
        return slot if slot > since else None

    async def _observe(self, trigger: Trigger) -> Observation | None:
        base = await asyncio.to_thread(self.records.baseline, trigger.name)
        try:
            observation = await observe(trigger.data, base[1] if base else None, self._backend_configs(trigger))
        except SourceUnavailable as exc:
            self.problems[trigger.name] = str(exc)
            return None
        self.problems.pop(trigger.name, None)
        return observation

    def _backend_configs(self, trigger: Trigger) -> Mapping[str, Any]:
        if self._configs is None and trigger.data.prefix is not None:
            from trainmaster.backends.config import load_configs
            from trainmaster.broker import paths

            self._configs = load_configs(paths.config_dir())
        return self._configs or {}

    async def _allowed(self, trigger: Trigger) -> bool:
        if not trigger.budget_gate or self.gate is None:
            return True
        refusal = await self.gate(trigger.spec, trigger.policy)
        if refusal:
            self.problems[trigger.name] = refusal
            return False
        self.problems.pop(trigger.name, None)
        return True

    # firing

    async def _fire(self, trigger: Trigger, decision: _Decision, now: float) -> list[Fired]:
        cursor = decision.observation.cursor if decision.observation else None
        last = await asyncio.to_thread(self.records.last, trigger.name)
        key = f"{trigger.name}:{last.id if last else 0}:{_digest(decision.slot, cursor)}"
        fire = await asyncio.to_thread(
            lambda: self.records.record(trigger=trigger.name, key=key, reason=f"trigger {trigger.name}: "
                                        f"{decision.reason}", spec_path=str(trigger.spec), policy=trigger.policy,
                                        slot=decision.slot, cursor=cursor, now=now))
        return [await self._submit(fire)] if fire is not None else []

    async def _submit(self, fire: Fire) -> Fired:
        """Submit a recorded fire. An error the submit raises ends the fire; a crash (BaseException), or the state
        database away (the submit could not be told from one that never happened), leaves it pending, to be
        submitted by the next tick of this or another process."""
        from trainmaster.storage import statedb

        try:
            job_id = await self.submit(Path(fire.spec_path), fire.policy, fire.reason, fire.key)
        except statedb.OperationalError:
            raise
        except Exception as exc:
            await asyncio.to_thread(self.records.refused, fire.id, str(exc) or type(exc).__name__)
            return Fired(fire.trigger, fire.key, fire.reason, None, str(exc) or type(exc).__name__)
        await asyncio.to_thread(self.records.submitted, fire.id, job_id)
        return Fired(fire.trigger, fire.key, fire.reason, job_id)


def _digest(slot: float | None, cursor: dict | None) -> str:
    text = json.dumps({"slot": slot, "cursor": cursor}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _when(slot: float, zone: str) -> str:
    return datetime.fromtimestamp(slot, ZoneInfo(zone)).strftime(f"%Y-%m-%d %H:%M {zone}")
