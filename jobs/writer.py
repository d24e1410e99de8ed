"""A background thread that writes finished segments in order while training goes on.

The training thread hands over a segment (a snapshot of S_i and the trace of steps i*k..(i+1)*k-1)
and carries on; the queue is short, so a slow disk throttles training instead of piling up
copies. A write error is raised on the training thread at the next hand-over or at
:meth:`SegmentWriter.close`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from pathlib import Path

from .checkpoint import CheckpointError, write_segment
from .decisions import DecisionTrace
from .state import TrainState


class SegmentWriter:
    def __init__(self, root: Path, *, job_id: str, recipe: str, k: int):
        self.root, self.job_id, self.recipe, self.k = Path(root), job_id, recipe, k
        self._error: BaseException | None = None
        self._tasks: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=2)
        self._thread = threading.Thread(target=self._work, name="trainmaster-checkpoint", daemon=True)
        self._thread.start()

    def write(self, index: int, snapshot: TrainState, trace: DecisionTrace) -> None:
        """Queue segment ``index``; ``snapshot`` (from :meth:`TrainState.snapshot`) now belongs to the writer."""
        self._raise_error()
        tensors = trace.to_tensors()
        step = index * self.k
        self._tasks.put(
            lambda: write_segment(
                self.root, index, snapshot, tensors, job_id=self.job_id, recipe=self.recipe, step=step, k=self.k
            )
        )

    def close(self) -> None:
        """Wait for every queued write; raise the first error any of them hit."""
        self._tasks.put(None)
        self._thread.join()
        self._raise_error()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise CheckpointError(f"checkpointing failed, training stopped: {self._error}") from self._error

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            if self._error is None:
                try:
                    task()
                except BaseException as exc:  # reported on the training thread
                    self._error = exc
