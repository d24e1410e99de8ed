"""Run the broker on one job with the real Bittensor backend (the miners of backends.yaml in
TRAINMASTER_HOME) in this process, and die (os._exit, what kill -9 leaves) at a named step.

    python tests/bittensor_settle_driver.py POINT SPEC POLICY STATE_DIR

As tests/settle_driver.py, whose crash points it shares: the first run submits the job (its id kept in
STATE_DIR/job_id) and waits for it; later runs bring it up to date with `Broker.advance`. POINT is
`verdict`, `charge`, `transfer`, `conclude` (after the miner countersigned its conclusion) or `none`.
Transfers go to STATE_DIR/transfers.jsonl (tests/payment_support.py).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from payment_support import FileSender
from settle_driver import _die_after


def main(point: str, spec: str, policy: str, state: str) -> None:
    from trainmaster.backends.bittensor.backend import BittensorBackend
    from trainmaster.broker.service import Broker
    from trainmaster.broker.stages import collect
    from trainmaster.wallet.ledger import Ledger

    if point == "verdict":
        _die_after(collect, "verify")
    elif point == "charge":
        _die_after(Ledger, "charge", when=lambda kwargs: kwargs.get("payment") is not None)
    elif point == "conclude":
        _die_after(BittensorBackend, "conclude")
    state_dir = Path(state)
    broker = Broker(sender=FileSender(state_dir / "transfers.jsonl", die_after_send=point == "transfer"))
    job_file = state_dir / "job_id"
    if not job_file.exists():
        job = asyncio.run(broker.submit(Path(spec), policy))
        job_file.write_text(job.id)
        asyncio.run(broker.wait(job.id, timeout_s=240))
    else:
        asyncio.run(broker.advance(job_file.read_text()))
    broker.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
