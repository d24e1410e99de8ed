"""The lock a broker holds on a job while it dispatches or settles it: a file lock beside a SQLite state file, a
session advisory lock of the server when the state is on PostgreSQL. Holders take turns, coroutines of one
process included (each PostgreSQL holder has its own session), and a lock on one job never holds another back."""

from __future__ import annotations

import asyncio
import time

from trainmaster.broker import paths
from trainmaster.broker.service import _job_locked


async def _hold(job_id: str, spans: list, seconds: float = 0.2) -> None:
    async with _job_locked(paths.state_db(), job_id):
        start = time.monotonic()
        await asyncio.sleep(seconds)
        spans.append((job_id, start, time.monotonic()))


def test_holders_of_one_job_take_turns_and_other_jobs_do_not_wait(tm_home, database):
    spans: list = []

    async def main():
        began = time.monotonic()
        await asyncio.gather(*(_hold("j-1", spans) for _ in range(3)), _hold("j-2", spans))
        return began

    began = asyncio.run(main())
    mine = sorted((start, end) for job, start, end in spans if job == "j-1")
    assert len(mine) == 3 and all(later >= earlier_end for (_, earlier_end), (later, _) in zip(mine, mine[1:]))
    [(_, other_start, _)] = [s for s in spans if s[0] == "j-2"]
    assert other_start - began < 0.15  # j-2 never waited behind j-1
