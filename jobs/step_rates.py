"""The largest learning rate any optimizer step used while a block of code ran (on this thread).

The update-norm checks measure a segment's weight change per unit of learning rate. The rate the
segment ended with understates the segment's steps at the end of a decaying schedule (cosine decay
to ~0 makes the last segment's ratio hundreds of times its honest size) and the executor's S_i
records a scheduled rate the trainer overwrites anyway, so the verifier reads the rates its own
re-execution actually stepped with, through torch's global optimizer step hook.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class StepRates:
    """What :func:`recording_step_rates` saw: the largest positive ``lr`` of any param group stepped."""

    peak: float | None = None


@contextmanager
def recording_step_rates() -> Iterator[StepRates]:
    """Record the largest ``lr`` of every optimizer step taken on the calling thread inside the block."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    seen, thread = StepRates(), threading.get_ident()

    def hook(optimizer, _args, _kwargs) -> None:
        if threading.get_ident() != thread:
            return
        rates = [g["lr"] for g in optimizer.param_groups if isinstance(g.get("lr"), int | float) and g["lr"] > 0]
        if rates and (seen.peak is None or max(rates) > seen.peak):
            seen.peak = float(max(rates))

    handle = register_optimizer_step_pre_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()
