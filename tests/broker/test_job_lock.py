"""The lock a broker holds on a job while it dispatches or settles it: a file lock beside a SQLite state file, a
session advisory lock of the server when the state is on PostgreSQL. Holders take turns, brokers and coroutines
of one broker alike (each PostgreSQL holder has its own session while it holds the lock), and a lock on one job
never holds another back. On PostgreSQL a released lock's session is kept by its broker for the next lock, the
lock released on it all the same; closing the broker ends it."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from trainmaster.broker.service import Broker
from trainmaster.broker.store import Store


async def _hold(broker: Broker, job_id: str, spans: list, seconds: float = 0.2) -> None:
    async with broker.parts.locks.held(job_id):
        start = time.monotonic()
        await asyncio.sleep(seconds)
        spans.append((job_id, start, time.monotonic()))


def test_holders_of_one_job_take_turns_and_other_jobs_do_not_wait(tm_home, database):
    spans: list = []
    first, second = Broker(), Broker()

    async def main():
        began = time.monotonic()
        await asyncio.gather(_hold(first, "j-1", spans), _hold(first, "j-1", spans), _hold(second, "j-1", spans),
                             _hold(second, "j-2", spans))
        return began

    try:
        began = asyncio.run(main())
    finally:
        first.close()
        second.close()
    mine = sorted((start, end) for job, start, end in spans if job == "j-1")
    assert len(mine) == 3 and all(later >= earlier_end for (_, earlier_end), (later, _) in zip(mine, mine[1:]))
    [(_, other_start, _)] = [s for s in spans if s[0] == "j-2"]
    assert other_start - began < 0.15  # j-2 never waited behind j-1


def test_a_released_lock_is_free_to_others_while_its_session_serves_the_next_lock(tm_home, postgres_url):
    broker, other = Broker(store=Store(postgres_url)), Broker(store=Store(postgres_url))

    async def lock_each(names: list[str], *, failing: str | None = None) -> None:
        for name in names:
            try:
                async with broker.parts.locks.held(name):
                    if name == failing:
                        raise RuntimeError("a step failed")
            except RuntimeError:
                pass

    with psycopg.connect(postgres_url, autocommit=True) as observer:
        def sessions() -> int:
            return observer.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                    ).fetchone()[0]

        try:
            asyncio.run(lock_each(["j-0"]))
            before = sessions()
            asyncio.run(lock_each([f"j-{i}" for i in range(1, 30)], failing="j-7"))
            assert sessions() == before == 4  # the observer, two stores, the one lock session kept: none per lock

            async def taken_by_the_other() -> None:  # each released, the failed step's included
                for name in ("j-0", "j-7", "j-29"):
                    await asyncio.wait_for(_hold(other, name, [], seconds=0), timeout=2)

            asyncio.run(taken_by_the_other())
        finally:
            other.close()
            broker.close()
        deadline = time.monotonic() + 5
        while sessions() > 1 and time.monotonic() < deadline:  # a closed session's server process exits soon after
            time.sleep(0.05)
        assert sessions() == 1  # the observer's own: the kept lock sessions ended with their brokers


@pytest.mark.parametrize("kept", [0, 1])
def test_a_session_beyond_what_is_kept_is_closed_and_releases_its_lock(postgres_url, kept):
    from trainmaster.storage.dialects.postgresql import SessionLocks

    locks, other = SessionLocks(postgres_url, kept=kept), SessionLocks(postgres_url)

    async def main() -> None:
        async def held(seconds: float) -> None:
            async with locks.hold("j-1"):
                await asyncio.sleep(seconds)

        async def taken_by_the_other() -> None:
            async with other.hold("j-1"):
                pass

        await asyncio.gather(held(0.1), held(0.1))  # two sessions open at once, `kept` of them kept
        await asyncio.wait_for(taken_by_the_other(), timeout=2)  # released, kept or closed

    try:
        asyncio.run(main())
        assert len(locks._idle) == kept
    finally:
        locks.close()
        other.close()
