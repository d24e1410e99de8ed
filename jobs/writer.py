"""A background thread that writes segment checkpoints in order while training goes on.

The training thread validates and copies the state (so a state that cannot be serialized fails at
the step that produced it), then queues the write; the queue is short, so a slow disk throttles
training instead of piling up copies. A write error is raised on the training thread at the next
checkpoint or at :meth:`SegmentWriter.close`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from .canonical import canonical_tensors
from .checkpoint import CheckpointError, PendingSegment, complete_segment, write_state
from .decisions import DecisionTrace
from .state import TrainState


def _copy(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in canonical_tensors(tensors).items()}


class SegmentWriter:
    def __init__(self, root: Path, *, job_id: str, recipe: str, k: int, pending: PendingSegment | None = None):
        self.root, self.job_id, self.recipe, self.k = Path(root), job_id, recipe, k
        self._pending = pending
        self._error: BaseException | None = None
        self._tasks: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=2)
        self._thread = threading.Thread(target=self._work, name="trainmaster-checkpoint", daemon=True)
        self._thread.start()

    def write_state(self, index: int, step: int, state: TrainState) -> None:
        """Queue S_index (taken at ``step``) for writing; the state is copied first."""
        copy = TrainState(weights=_copy(state.weights), rest=_copy(state.rest))
        self._submit(lambda: self._write_state(index, step, copy))

    def complete(self, index: int, trace: DecisionTrace) -> None:
        """Queue segment ``index``'s decision trace; that fixes its leaf."""
        tensors = _copy(trace.to_tensors())
        self._submit(lambda: self._complete(index, tensors))

    def close(self) -> None:
        """Wait for every queued write; raise the first error any of them hit."""
        self._tasks.put(None)
        self._thread.join()
        self._raise_error()

    def _submit(self, task: Callable[[], None]) -> None:
        self._raise_error()
        self._tasks.put(task)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise CheckpointError(f"checkpointing failed, training stopped: {self._error}") from self._error

    def _write_state(self, index: int, step: int, state: TrainState) -> None:
        self._pending = write_state(self.root, index, state, job_id=self.job_id, recipe=self.recipe, step=step, k=self.k)

    def _complete(self, index: int, trace: dict[str, torch.Tensor]) -> None:
        if self._pending is None or self._pending.manifest.segment != index:
            raise CheckpointError(f"segment {index} completed before its state was written")
        complete_segment(self._pending, trace)
        self._pending = None

    def _work(self) -> None:
        while (task := self._tasks.get()) is not None:
            if self._error is None:
                try:
                    task()
                except BaseException as exc:  # reported on the training thread
                    self._error = exc
