"""The reconciler: advance open jobs concurrently, each under a lease in the database.

One pass lists what may move (running jobs first, then the queue in order, then verdicts still to
settle with their executors), and hands each job to a free worker (a Broker of its own, with its own
database connection). A worker first claims the job's lease (`leases.py`); a job another live holder
has is skipped. While the worker advances the job it renews the lease, and it releases it at the end.
The lease calls run off the caller's event loop: on the worker's thread (claim, step and release are
one hop there) or in `asyncio.to_thread`. A pass is bounded: at most `limit` jobs, and no new job is
started after `budget_s` seconds (steps under way finish).

Where the workers' steps run is the constructor's explicit choice (`loops`). The daemon gives each broker
a WorkerLoop of its own (broker/daemon/worker_loop.py): the broker was made there and its steps
(`advance`, `settle_with_executors`, `promote_pending`) and store calls run there, so their synchronous
database calls block that worker's thread only: the workers' database waits overlap, and the daemon's main
loop (the API, the triggers, the dashboard) keeps answering. `loops=None` runs the brokers on the caller's
loop: a CLI command without a daemon, which runs one bounded pass, or one scoped to the job it names
(`scoped`), so `status X` never advances another job.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from trainmaster.broker import failures, states
from trainmaster.broker.daemon.leases import Leases
from trainmaster.broker.daemon.worker_loop import WorkerLoop

log = logging.getLogger("trainmaster.daemon")

LEASE_S = 30.0
"""A lease's time to live; renewed every third of it while its job is advanced."""
PASS_LIMIT = 50
PASS_BUDGET_S = 20.0


@dataclass
class PassResult:
    """What one pass did: jobs advanced, skipped (leased by another holder), and that failed a step."""

    advanced: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass(frozen=True)
class Worker:
    """A broker and the loop its steps run on (None: the caller's)."""

    broker: Any
    loop: WorkerLoop | None

    def run(self, coro: Coroutine) -> Awaitable:
        """The broker's coroutine `coro`, run on the worker's loop."""
        return coro if self.loop is None else self.loop.submit(coro)

    def call(self, fn: Callable, *args: Any) -> Awaitable:
        """A synchronous call (the store's), off the caller's loop: on the worker's thread, or a thread of its own."""
        return asyncio.to_thread(fn, *args) if self.loop is None else self.loop.call(fn, *args)

    async def blocking(self, fn: Callable, *args: Any) -> Any:
        """A synchronous call made from the coroutine `run` runs: on the worker's own thread as it is, else off the
        caller's loop."""
        return fn(*args) if self.loop is not None else await asyncio.to_thread(fn, *args)


class Reconciler:
    """Advances jobs with the given brokers (one job per broker at a time) as lease holder `holder`.

    `loops`: the WorkerLoop each broker was made on and runs on (`loops[i]` is `brokers[i]`'s: the daemon), or
    None to run every broker on the caller's loop (a CLI command's one pass without a daemon)."""

    def __init__(self, brokers: Sequence, leases: Leases, holder: str, *, loops: Sequence[WorkerLoop] | None,
                 ttl_s: float = LEASE_S):
        if loops is not None and len(loops) != len(brokers):
            raise ValueError(f"{len(brokers)} brokers but {len(loops)} worker loops: one loop per broker")
        self.leases, self.holder, self.ttl_s = leases, holder, ttl_s
        self._workers = [Worker(b, loops[i] if loops is not None else None) for i, b in enumerate(brokers)]
        self._free: asyncio.Queue = asyncio.Queue()
        for worker in self._workers:
            self._free.put_nowait(worker)
        self._in_flight: set[str] = set()
        self._in_flight_lock = threading.Lock()  # changed on the workers' threads, read on the main one

    async def run_pass(self, *, limit: int = PASS_LIMIT, budget_s: float = PASS_BUDGET_S,
                       stopping: asyncio.Event | None = None) -> PassResult:
        """Advance up to `limit` open jobs; none is started after `budget_s` seconds, or once `stopping` is set."""
        started, result = time.monotonic(), PassResult()
        moving, queued, settling = await self._workers[0].call(self._candidates, limit)

        def more() -> bool:
            return time.monotonic() - started < budget_s and not (stopping and stopping.is_set())

        await asyncio.gather(*(self._one(job_id, result, more) for job_id in moving))
        for job_id in queued:  # in queue order, on what the others freed
            await self._one(job_id, result, more)
        await asyncio.gather(*(self._one(job_id, result, more, settle_only=True) for job_id in settling))
        if more():
            await self._promotions()
        result.seconds = time.monotonic() - started
        return result

    async def _promotions(self) -> None:
        """Carry on the promotions into the model registry left pending (a registry that was down)."""
        worker = await self._free.get()
        try:
            await worker.run(worker.broker.promote_pending())
        finally:
            self._free.put_nowait(worker)

    async def scoped(self, job_id: str):
        """Advance only `job_id` (and, as `Broker.advance` does, the jobs holding the machine it queues for);
        its errors are raised, as a command that names the job shows them. Returns the job as it is then,
        unadvanced when another live holder has its lease."""
        worker = await self._free.get()
        try:
            if not await asyncio.to_thread(self.leases.claim, job_id, self.holder, self.ttl_s):
                return await worker.call(worker.broker.store.job, job_id)
            try:
                async with self._renewed(job_id):
                    return await worker.run(worker.broker.advance(job_id))
            finally:
                await asyncio.to_thread(self.leases.release, job_id, self.holder)
        finally:
            self._free.put_nowait(worker)

    async def scoped_pass(self, job_id: str) -> PassResult:
        """A pass over `job_id` alone: like `scoped`, but its errors are recorded on the job, as a pass does
        (for a command whose own call on the job comes next: `cancel`, `logs`, `resume`)."""
        result = PassResult()
        await self._one(job_id, result, lambda: True)
        return result

    def _candidates(self, limit: int) -> tuple[list[str], list[str], list[str]]:
        """Running jobs, then the queue in order, then verdicts to settle. Read at the start of a pass, when
        every worker is idle, through the first worker's connection (on its thread)."""
        broker = self._workers[0].broker
        store = broker.store
        moving = set(states.JOB_TRANSITIONS) - states.JOB_ENDS - {"queued"}
        first = [job.id for job in store.jobs(states_in=moving, limit=limit)]
        queued = [job.id for job in store.queued_jobs()][: max(0, limit - len(first))]
        taken = set(first) | set(queued)
        settling = [j for j in dict.fromkeys(j for j, _ in broker.settlement.pending()) if j not in taken]
        return first, queued, settling[: max(0, limit - len(taken))]

    def in_flight(self) -> list[str]:
        """The jobs being advanced now, in order."""
        with self._in_flight_lock:
            return sorted(self._in_flight)

    async def _one(self, job_id: str, result: PassResult, more, *, settle_only: bool = False) -> None:
        worker = await self._free.get()
        try:
            if more():
                await worker.run(self._leased(worker, job_id, result, settle_only))
        finally:
            self._free.put_nowait(worker)

    async def _leased(self, worker: Worker, job_id: str, result: PassResult, settle_only: bool) -> None:
        """Claim the job's lease, advance it, release the lease: one coroutine on the worker's loop, so a job
        costs one hop to the worker's thread."""
        if not await worker.blocking(self.leases.claim, job_id, self.holder, self.ttl_s):
            result.skipped.append(job_id)
            return
        try:
            async with self._renewed(job_id):
                await self._advance(worker, job_id, result, settle_only)
        finally:
            await worker.blocking(self.leases.release, job_id, self.holder)

    @asynccontextmanager
    async def _renewed(self, job_id: str):
        """The job counted in flight, its lease renewed (on the running loop), while the body runs."""
        with self._in_flight_lock:
            self._in_flight.add(job_id)
        renewing = asyncio.create_task(self._renew(job_id))
        try:
            yield
        finally:
            renewing.cancel()
            with self._in_flight_lock:
                self._in_flight.discard(job_id)

    async def _advance(self, worker: Worker, job_id: str, result: PassResult, settle_only: bool) -> None:
        """The step, run on the worker's loop (`_leased`)."""
        broker = worker.broker
        try:
            if settle_only:
                await broker.settle_with_executors(job_id)
            else:
                await broker.advance(job_id)
            result.advanced.append(job_id)
        except failures.Waiting:
            result.advanced.append(job_id)  # recorded on the attempt, with what to fix
        except Exception as exc:  # noqa: BLE001 — recorded on the job, retried by the next pass
            result.errors.append(job_id)
            await worker.blocking(broker.store.log_event, job_id, "error",
                                  {"message": f"{type(exc).__name__}: {exc}"})

    async def _renew(self, job_id: str) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            if not await asyncio.to_thread(self.leases.renew, job_id, self.holder, self.ttl_s):
                log.warning("lost the lease on %s while advancing it", job_id)
                return
