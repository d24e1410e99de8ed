"""A background thread that writes finished segments in order while training goes on.

The training thread serializes S_i when step i*k ends (one copy, in canonical form, so an entry
that cannot be serialized fails at the step whose state it is) and hands it over with the segment's
trace when step (i+1)*k ends. The writer thread then only hashes, writes and fsyncs, which release
the GIL, at a lower CPU priority, so the training thread is barely slowed. The queue is short, so a slow disk throttles
training instead of piling up copies. A write error is raised on the training thread at the next
hand-over or at :meth:`SegmentWriter.close`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .canonical import serialize
from .checkpoint import CheckpointError, lower_thread_priority, write_segment_bytes
from .decisions import DecisionTrace
from .state import TrainState


@dataclass(frozen=True)
class SerializedState:
    """The canonical bytes of a state's two parts: a stable copy that costs one memcpy."""

    weights: bytes
    rest: bytes

    @classmethod
    def of(cls, state: TrainState) -> SerializedState:
        return cls(serialize(state.weights), serialize(state.rest))


class SegmentWriter:
    def __init__(self, root: Path, *, job_id: str, recipe: str, k: int):
        self.root, self.job_id, self.recipe, self.k = Path(root), job_id, recipe, k
        self._error: BaseException | None = None
        self._tasks: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=2)
        self._thread = threading.Thread(target=self._work, name="trainmaster-checkpoint", daemon=True)
        self._thread.start()

    def write(self, index: int, state: SerializedState, trace: DecisionTrace) -> None:
        """Queue segment ``index``: S_index (serialized when it was reached) and its trace."""
        self._raise_error()
        step = index * self.k

        def task() -> None:
            write_segment_bytes(
                self.root, index, [state.weights], [state.rest], [serialize(trace.to_tensors())],
                job_id=self.job_id, recipe=self.recipe, step=step, k=self.k,
            )

        self._tasks.put(task)

    def close(self) -> None:
        """Wait for every queued write; raise the first error any of them hit."""
        self._tasks.put(None)
        self._thread.join()
        self._raise_error()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise CheckpointError(f"checkpointing failed, training stopped: {self._error}") from self._error

    def _work(self) -> None:
        lower_thread_priority()
        while (task := self._tasks.get()) is not None:
            if self._error is None:
                try:
                    task()
                except BaseException as exc:  # reported on the training thread
                    self._error = exc
