"""One reconciler process for tests/broker/daemon/test_reconciler.py: a pass over the home's jobs whose `advance` only
records when it ran (job, pid, start, end) and sleeps, so two such processes show whether they overlap."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

from trainmaster.broker import paths
from trainmaster.broker.daemon.leases import Leases
from trainmaster.broker.daemon.reconciler import Reconciler
from trainmaster.broker.service import Broker


class RecordingBroker(Broker):
    def __init__(self, out: Path):
        super().__init__()
        self.out = out

    async def advance(self, job_id: str):
        start = time.time()
        await asyncio.sleep(0.3)
        with self.out.open("a") as f:
            f.write(json.dumps([job_id, os.getpid(), start, time.time()]) + "\n")


async def main(out: Path, start_at: float) -> None:
    reconciler = Reconciler([RecordingBroker(out), RecordingBroker(out)], Leases(paths.state_db()),
                            f"test-{os.getpid()}", loops=None)
    await asyncio.sleep(max(0.0, start_at - time.time()))
    result = await reconciler.run_pass()
    print(json.dumps({"advanced": result.advanced, "skipped": result.skipped}))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), float(sys.argv[2])))
