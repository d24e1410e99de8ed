"""Following a job's log: the latest attempt's log from its start, asked of its backend by byte offset; with
`follow`, until the job ends, across fallbacks, the job advanced (its cost cap checked) as it runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from trainmaster.backends.base import Handle
from trainmaster.backends.retry import retried
from trainmaster.broker import states
from trainmaster.broker.executor_text import attempt_log
from trainmaster.broker.stages.advancing import advance
from trainmaster.broker.stages.job_context import Parts

LOG_POLL_S = 0.2
WATCH_S = 1.0  # while `logs -f` follows a running job, it is watched (its cost cap checked) this often


async def logs(parts: Parts, job_id: str, *, follow: bool = False) -> AsyncIterator[str]:
    """The latest attempt's log from its start; with `follow`, until the job ends (across fallbacks)."""
    store = parts.store
    job = store.find_job(job_id)
    current, offset, watched = None, 0, time.time()
    while True:
        attempts = [a for a in store.attempts(job.id) if a.handle_json]
        if not attempts:
            if not follow or store.job(job.id).state in states.JOB_ENDS | states.WAITING:
                return
            await asyncio.sleep(LOG_POLL_S)
            job = await advance(parts, job.id)
            continue
        last = attempts[-1]
        if last.id != current:
            current, offset = last.id, 0
        backend = parts.backends.backend(last.backend, parts.policy(job))
        chunk = await retried(backend.logs, Handle.model_validate_json(last.handle_json), offset)
        offset = chunk.next_offset
        if chunk.text:  # an untrusted executor's log may paint over the terminal: its controls made visible
            yield attempt_log(last.offer_json, chunk.text)
            continue
        if not follow:
            return
        if not chunk.complete and time.time() - watched >= WATCH_S:  # its cost cap is checked as it runs
            job, watched = await advance(parts, job.id), time.time()
            continue
        if chunk.complete:
            job = await advance(parts, job.id)
            newer = [a for a in store.attempts(job.id) if a.handle_json and a.n > last.n]
            if job.state in states.JOB_ENDS | states.WAITING and not newer:
                return
            if newer:
                continue
        await asyncio.sleep(LOG_POLL_S)
