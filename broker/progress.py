"""How far a job has come, for a status line: its state, step/T and steps/s, elapsed time, cost so
far and ETA.

Nothing here knows about terminals (the CLI draws it: broker/cli/live.py) and nothing here asks a
backend anything: a sample reads the store and at most the last few KB of one file, so a caller can
take one twice a second whatever the job writes.

- the step comes from the `metrics.jsonl` the job writes (docs/runtime.md#metricsjsonl), read where
  the broker can read it: the attempt's own outputs folder, which is where the local backend runs
  it. A remote attempt's file is not here, so its step, rate and ETA are unknown (None);
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
from pathlib import Path

from trainmaster.backends.base import Offer
from trainmaster.broker import paths, states
from trainmaster.broker.store import Attempt
from trainmaster.jobs.environment import expand_command
from trainmaster.jobs.files import HostileFile, read_tail
from trainmaster.jobs.metrics import FILENAME as METRICS_FILE
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


def last_step(path: Path, tail_bytes: int = TAIL_BYTES) -> StepSample | None:
    """The step of the newest complete line of a `metrics.jsonl`, reading only its last `tail_bytes`
    (None when there is no file, no regular file — a FIFO is never opened, a link never followed — or
    no readable step there: a line longer than the tail, a torn one). A step is an int in [0, MAX_STEP]."""
    try:
        tail, start, info = read_tail(path, tail_bytes)
    except (OSError, HostileFile):
        return None
    lines = tail.split(b"\n")
    # the last piece is a line still being written (b"" after a final newline); past a seek, the first may be cut
    for raw in reversed(lines[1 if start else 0:-1]):
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, int) and not isinstance(step, bool) and 0 <= step <= MAX_STEP:
            return StepSample(step, info.st_mtime)
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
    store and files only; it never advances the job."""

    def __init__(self, broker, job_id: str, *, clock: Callable[[], float] = time.time,
                 window_s: float = RATE_WINDOW_S):
        self.store = broker.store
        self.job_id = job_id
        self.clock = clock
        self.window_s = window_s
        spec = JobSpec.model_validate_json(self.store.job(job_id).spec_json)
        self.total = total_steps(spec.entrypoint, {**os.environ, **spec.env})
        self._attempt: str | None = None
        self._samples: deque[StepSample] = deque()

    def sample(self) -> JobProgress:
        job = self.store.job(self.job_id)
        attempts = self.store.attempts(self.job_id)
        if attempts:
            self._see(attempts[-1])
        return progress_of(job.state, attempts, self._samples, self.total, self.clock())

    def _see(self, attempt: Attempt) -> None:
        if attempt.id != self._attempt:  # a new attempt counts its own steps
            self._attempt = attempt.id
            self._samples.clear()
        seen = last_step(paths.attempt_dir(attempt.job_id, attempt.n) / "outputs" / METRICS_FILE)
        if seen is None or (self._samples and seen.step == self._samples[-1].step):
            return
        if self._samples and seen.step < self._samples[-1].step:
            self._samples.clear()  # the file was started again (a script that rewrote it)
        self._samples.append(seen)
        while len(self._samples) > 2 and seen.at - self._samples[0].at > self.window_s:
            self._samples.popleft()
