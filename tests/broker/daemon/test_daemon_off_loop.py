"""The daemon's database work stays off its main event loop: each reconciler worker runs on a WorkerLoop of its own
(broker/daemon/worker_loop.py), so two workers whose database calls wait do so at the same time while the main
loop keeps ticking (on SQLite and PostgreSQL); and a real daemon whose API broker waits on a locked database
still answers `/v1/health` at once."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from daemon_support import get, kill, start

from trainmaster.broker import paths
from trainmaster.broker.daemon.leases import Leases
from trainmaster.broker.daemon.reconciler import Reconciler
from trainmaster.broker.daemon.worker_loop import WorkerLoop
from trainmaster.broker.service import Broker
from trainmaster.broker.store import Store
from trainmaster.storage import statedb

HOLD_S = 1.5
"""How long the test holds the state database's write lock."""
RESPONSIVE_S = 0.3
"""The longest the main loop (or /v1/health) may take meanwhile."""
TRAIN = "print('hello')\n"


class SlowWriteBroker(Broker):
    """A worker whose step is one store write (which waits while the test holds the lock), recorded as
    (job, thread, start, end)."""

    def __init__(self, spans: list):
        super().__init__()
        self.spans = spans

    async def advance(self, job_id: str):
        start = time.monotonic()
        self.store.log_event(job_id, "probe", {})
        self.spans.append((job_id, threading.get_ident(), start, time.monotonic()))


def _open_job(store: Store, job_id: str) -> None:
    store.create_job(job_id=job_id, name="open", workload="development", project=None, spec_json="{}",
                     spec_path="job.yaml", bundle_sha256="0" * 64, policy="default", policy_json="{}")


def _lock_writes(where):
    """Take the state database's write lock on a connection of the test's own (readers still read); the
    function that releases it."""
    if statedb.is_server(where):
        db = statedb.connect(where)
        db.execute("BEGIN")
        db.execute("LOCK TABLE events IN EXCLUSIVE MODE")
    else:
        db = sqlite3.connect(where, isolation_level=None, timeout=30, check_same_thread=False)
        db.execute("BEGIN EXCLUSIVE")

    def release() -> None:
        db.execute("ROLLBACK")
        db.close()

    return release


async def _pass_while_locked(tmp_path: Path) -> tuple[list, float, float]:
    """One pass of two workers over two jobs while writes are locked for HOLD_S: the steps' spans, the longest
    gap between the main loop's ticks, and when the lock was released."""
    spans: list = []
    loops = [WorkerLoop(f"test-{i}") for i in range(2)]
    brokers = [await loop.call(SlowWriteBroker, spans) for loop in loops]
    leases = Leases(tmp_path / "leases.db")  # a file of their own: claiming a job never waits on the lock
    for broker in brokers:
        broker.settlement.pending()  # its tables made before the lock is taken
    reconciler = Reconciler(brokers, leases, "test", loops=loops)
    gaps, released = [0.0], []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            gaps.append(time.monotonic() - last)
            last = time.monotonic()

    release = _lock_writes(paths.state_db())
    # released by a thread: a main loop held up by a worker's wait must not keep the lock from being released
    threading.Timer(HOLD_S, lambda: (release(), released.append(time.monotonic()))).start()
    ticking = asyncio.create_task(tick())
    try:
        result = await reconciler.run_pass()
    finally:
        ticking.cancel()
        for loop in loops:
            loop.stop()
        for broker in brokers:
            broker.close()
        leases.close()
    assert sorted(result.advanced) == ["job-a", "job-b"] and not result.errors, result
    return spans, max(gaps), released[0]


def test_two_workers_wait_on_the_database_at_once_and_the_main_loop_keeps_running(tm_home, database, tmp_path):
    store = Store(paths.state_db())
    _open_job(store, "job-a")
    _open_job(store, "job-b")
    store.close()
    spans, longest_gap, released = asyncio.run(_pass_while_locked(tmp_path))
    assert len(spans) == 2
    (_, thread_a, start_a, end_a), (_, thread_b, start_b, end_b) = spans
    assert thread_a != thread_b and threading.get_ident() not in (thread_a, thread_b)
    assert max(start_a, start_b) < min(end_a, end_b)  # the two steps overlap
    assert min(end_a, end_b) >= released - 0.05  # both waited for the lock, together
    assert longest_gap < RESPONSIVE_S, f"the main loop stalled {longest_gap:.2f} s"


def test_worker_loop_stop_cancels_what_runs_there():
    async def scenario() -> None:
        loop = WorkerLoop("test")
        asleep = loop.submit(asyncio.sleep(3600))
        assert await loop.call(threading.get_ident) != threading.get_ident()
        await asyncio.to_thread(loop.stop)
        with pytest.raises(asyncio.CancelledError):
            await asleep
        assert loop.loop.is_closed()

    asyncio.run(scenario())


def _post(address: str, path: str, body: dict, secret: str) -> tuple[int, dict]:
    request = urllib.request.Request(address + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return reply.status, json.loads(reply.read())


@pytest.mark.slow
def test_health_answers_at_once_while_a_submit_waits_on_the_database(tm_home, job_factory):
    spec = job_factory(TRAIN)
    state = start(tm_home)
    try:
        secret = (tm_home / "daemon" / "token").read_text().strip()
        assert get(state["address"], "/v1/health", token=secret)[0] == 200
        submitted: list = []
        release = _lock_writes(paths.state_db())
        submitting = threading.Thread(target=lambda: submitted.append(
            (*_post(state["address"], "/v1/jobs", {"spec": str(spec)}, secret), time.monotonic())))
        submitting.start()
        probes, until = [], time.monotonic() + HOLD_S
        while time.monotonic() < until:
            began = time.monotonic()
            assert get(state["address"], "/v1/health", token=secret)[0] == 200
            probes.append(time.monotonic() - began)
            time.sleep(0.05)
        released = time.monotonic()
        release()
        submitting.join(60)
        code, job, answered = submitted[0]
        assert code == 201 and job["id"]
        assert answered >= released  # the submit was waiting on the lock all the while the probes ran
        assert len(probes) >= 10 and max(probes) < RESPONSIVE_S, probes
    finally:
        kill(state["pid"])
