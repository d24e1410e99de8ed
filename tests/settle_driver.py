"""Run the broker on one untrusted job in this process and die (os._exit, what kill -9 leaves) at a named step.

    python tests/settle_driver.py POINT SPEC POLICY STATE_DIR

The first run submits the job (its id kept in STATE_DIR/job_id) and waits for it; later runs bring it up to
date with `Broker.advance`, as any CLI command would. POINT is where the process dies: right after the
verdict is stored (`verdict`), after the charge and its payment are recorded (`charge`), after the transfer
is made (`transfer`), after the executor acknowledged its conclusion (`conclude`), or nowhere (`none`).
Transfers go to STATE_DIR/transfers.jsonl (tests/payment_support.py).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from payment_support import FileSender
from untrusted_backend import UntrustedExecutor


def _die_after(owner, name: str, *, when=lambda kwargs: True) -> None:
    original = getattr(owner, name)
    if asyncio.iscoroutinefunction(original):
        async def wrapped(*args, **kwargs):
            result = await original(*args, **kwargs)
            if when(kwargs):
                os._exit(9)
            return result
    else:
        def wrapped(*args, **kwargs):
            result = original(*args, **kwargs)
            if when(kwargs):
                os._exit(9)
            return result
    setattr(owner, name, wrapped)


def main(point: str, spec: str, policy: str, state: str) -> None:
    from trainmaster.broker.service import Broker
    from trainmaster.broker.stages import collect
    from trainmaster.wallet.ledger import Ledger

    if point == "verdict":
        _die_after(collect, "verify")
    elif point == "charge":
        _die_after(Ledger, "charge", when=lambda kwargs: kwargs.get("payment") is not None)
    elif point == "conclude":
        _die_after(UntrustedExecutor, "conclude")
    state_dir = Path(state)
    broker = Broker(backends={"bittensor": UntrustedExecutor()},
                    sender=FileSender(state_dir / "transfers.jsonl", die_after_send=point == "transfer"))
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
