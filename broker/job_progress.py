"""How far a job has come, for a status line: its state, step/T and steps/s, elapsed time, cost so
far and ETA.

Nothing here knows about terminals (the CLI draws it: broker/cli/live.py): a sample reads the store
and asks the latest attempt's backend for at most the last few KB of one file, so a caller can take
one twice a second whatever the job writes.

- the step comes from the `metrics.jsonl` the job writes (docs/runtime.md#metricsjsonl), its tail asked
  of the attempt's backend (`ReportsMetrics.metrics`, from an offset like its log): the broker never
  opens a backend's folder. A backend without that capability, or one unreachable now, leaves the
  step, rate and ETA unknown (None);
- T is the entrypoint's `--steps N` (the recipes' command line, and a common convention), None
  when it has none;
- steps/s is measured between the steps seen over the last RATE_WINDOW_S, each stamped with the
  file's modification time (the runtime flushes every k steps). With fewer than two different steps
  seen (a job that trains between two samples, or the first sample of a run) it is the step over the
  attempt's running time until the file held it, so a user sees a rate whenever a step is known, and
  the final line keeps its rate once the attempt has ended;
- the cost so far is each ended attempt's recorded cost plus, for one still running, its offer's
  price per hour times its time so far, rounded up to the micro-dollar as the local backend charges
  it (the real cost is recorded only when the attempt ends).
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from trainmaster.backends.base import BackendError, Handle, Offer
from trainmaster.backends.features import MetricsChunk, ReportsMetrics
from trainmaster.broker import states
from trainmaster.broker.store import Attempt
from trainmaster.jobs.environment import expand_command
from trainmaster.jobs.spec import JobSpec

TAIL_BYTES = 4096
"""How much of the end of `metrics.jsonl` is read: a few lines, whatever the size of the file."""
RATE_WINDOW_S = 30.0
MAX_STEP = 2**53
"""The largest step a job's metrics line may claim: past it a float (steps/s, ETA) loses whole steps,
and a step of 10**400 made the status line's arithmetic raise."""


@dataclass(frozen=True)
class JobProgress:
    state: str
    """The job's recorded state."""
    step: int | None = None
    """Steps completed by the latest attempt (its newest metrics line), None when unknown."""
    total: int | None = None
    """T, the steps the job runs, None when unknown."""
    steps_per_s: float | None = None
    elapsed_s: float | None = None
    """Time since the latest attempt started (to its end once it ended), None before any attempt."""
    cost_micro_usd: int = 0
    """Recorded costs of the ended attempts plus a running estimate for the live one."""
    eta_s: float | None = None
    """(T - step) / steps_per_s while the attempt is running, None when any of them is unknown."""


@dataclass(frozen=True)
class StepSample:
    step: int
    at: float
    """When the file held it: its modification time."""


async def read_tail(backend, handle: Handle, tail_bytes: int = TAIL_BYTES) -> MetricsChunk | None:
    """The last `tail_bytes` of the attempt's `metrics.jsonl`, asked of its backend (`ReportsMetrics`): its
    first `tail_bytes`, then, when the file is longer, its last; None when the backend cannot say (no such
    capability, or unreachable now)."""
    if not isinstance(backend, ReportsMetrics):
        return None
    try:
        chunk = await backend.metrics(handle, 0, tail_bytes)
        if chunk.size > chunk.next_offset:
            chunk = await backend.metrics(handle, chunk.size - tail_bytes, tail_bytes)
    except BackendError:
        return None
    return chunk


def last_step(chunk: MetricsChunk) -> StepSample | None:
    """The step of the newest complete line in a tail of a `metrics.jsonl` (None when there is no readable
    step there: no file, a line longer than the tail, a torn one)."""
    if chunk.modified_at is None:
        return None
    start, tail = chunk.offset, chunk.data
    lines = tail.split(b"\n")
    # the last piece is a line still being written (b"" after a final newline); past a seek, the first may be cut
    for raw in reversed(lines[1 if start else 0:-1]):
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, int) and not isinstance(step, bool) and 0 <= step <= MAX_STEP:
            return StepSample(step, chunk.modified_at)
    return None


def total_steps(entrypoint: str, env: Mapping[str, str]) -> int | None:
    """T from the entrypoint's `--steps N` or `--steps=N` (its words expanded as the job's are)."""
    try:
        words = expand_command(entrypoint, env)
    except ValueError:  # unbalanced quotes: the spec check refuses those; nothing to show here
        return None
    for i, word in enumerate(words):
        if word == "--steps" and i + 1 < len(words):
            value = words[i + 1]
        elif word.startswith("--steps="):
            value = word.removeprefix("--steps=")
        else:
            continue
        if value.isascii() and value.isdigit() and int(value) > 0:
            return int(value)
    return None


def steps_per_s(samples: Sequence[StepSample]) -> float | None:
    """The rate between the oldest and the newest sample, None without two different steps at two times."""
    if len(samples) < 2:
        return None
    first, last = samples[0], samples[-1]
    if last.step <= first.step or last.at <= first.at:
        return None
    return (last.step - first.step) / (last.at - first.at)


def steps_per_s_since_start(sample: StepSample, attempt: Attempt) -> float | None:
    """The step over the attempt's running time until the file held it: the rate when only one step was
    seen. It counts the process's start-up as running time, so it errs low; for an attempt resumed from
    a checkpoint it counts the steps before the resume point too, and errs high until a second step is seen."""
    start = attempt.started_at or attempt.created_at
    if sample.step <= 0 or sample.at <= start:
        return None
    return sample.step / (sample.at - start)


def attempt_cost(attempt: Attempt, now: float) -> int:
    """Its recorded cost, else (started, not yet costed) its offer's price for the time so far, in micro-USD."""
    if attempt.cost_micro_usd is not None:
        return attempt.cost_micro_usd
    if not attempt.handle_json:
        return 0  # never started
    price = Offer.model_validate_json(attempt.offer_json).price_per_hour_micro_usd
    return -(-int(_elapsed(attempt, now) * 1000) * price // 3_600_000)


def _elapsed(attempt: Attempt, now: float) -> float:
    start = attempt.started_at or attempt.created_at  # not yet seen running: since it was dispatched
    return max(0.0, (attempt.ended_at or now) - start)


def progress_of(state: str, attempts: Sequence[Attempt], samples: Sequence[StepSample], total: int | None,
                now: float) -> JobProgress:
    """The status of a job in `state` with these attempts (oldest first), the steps seen of the latest."""
    if not attempts:
        return JobProgress(state=state, total=total)
    latest = attempts[-1]
    step = samples[-1].step if samples else None
    rate = steps_per_s(samples)
    if rate is None and samples:
        rate = steps_per_s_since_start(samples[-1], latest)
    eta = None
    if rate and total is not None and step is not None and latest.state in states.ACTIVE_ATTEMPT:
        eta = max(0, total - step) / rate
    return JobProgress(state=state, step=step, total=total, steps_per_s=rate, elapsed_s=_elapsed(latest, now),
                       cost_micro_usd=sum(attempt_cost(a, now) for a in attempts), eta_s=eta)


class ProgressWatch:
    """Samples one job's progress over time (steps/s needs the steps seen before). Reads the broker's
    store and asks the latest attempt's backend for the tail of its metrics; it never advances the job."""

    def __init__(self, broker, job_id: str, *, clock: Callable[[], float] = time.time,
                 window_s: float = RATE_WINDOW_S):
        self.broker = broker
        self.store = broker.store
        self.job_id = job_id
        self.clock = clock
        self.window_s = window_s
        spec = JobSpec.model_validate_json(self.store.job(job_id).spec_json)
        self.total = total_steps(spec.entrypoint, {**os.environ, **spec.env})
        self._attempt: str | None = None
        self._samples: deque[StepSample] = deque()

    async def sample(self) -> JobProgress:
        job = self.store.job(self.job_id)
        attempts = self.store.attempts(self.job_id)
        if attempts:
            await self._see(job, attempts[-1])
        return progress_of(job.state, attempts, self._samples, self.total, self.clock())

    async def _see(self, job, attempt: Attempt) -> None:
        if attempt.id != self._attempt:  # a new attempt counts its own steps
            self._attempt = attempt.id
            self._samples.clear()
        if not attempt.handle_json:
            return
        backend = self.broker.backend(attempt.backend, self.broker.policy(job))
        chunk = await read_tail(backend, Handle.model_validate_json(attempt.handle_json))
        seen = last_step(chunk) if chunk is not None else None
        if seen is None or (self._samples and seen.step == self._samples[-1].step):
            return
        if self._samples and seen.step < self._samples[-1].step:
            self._samples.clear()  # the file was started again (a script that rewrote it)
        self._samples.append(seen)
        while len(self._samples) > 2 and seen.at - self._samples[0].at > self.window_s:
            self._samples.popleft()
