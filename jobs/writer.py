"""A background thread that writes finished segments in order while training goes on.

The training thread copies S_i in canonical form when step i*k ends (a GPU state's device-to-host
copy overlaps the next steps: ``jobs/host_copy.py``) (so an entry that cannot be
serialized fails at the step whose state it is) and hands it over with the segment's trace when
step (i+1)*k ends. The writer thread then only hashes, writes and fsyncs, which release the GIL,
at a lower CPU priority, so the training thread is barely slowed. The copies go into buffers the
writer has finished with (:class:`StateBuffers`). The queue is short, so a slow disk throttles
training instead of piling up copies. A write error is raised on the training thread at the next
hand-over or at :meth:`SegmentWriter.close`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .canonical import serialize, views
from .checkpoint import CheckpointError, lower_thread_priority, write_segment_bytes
from .decisions import DecisionTrace
from .devices import state_device_kind
from .host_copy import DeviceCopier, HostCopy, has_device_tensors
from .state import TrainState


class StateBuffers:
    """Byte buffers reused for the canonical copies of states.

    Copying a 1.2 GB state into a fresh ``bytes`` costs four times the copy itself in page faults
    (0.8 s against 0.2 s on the benchmark machine), and the training loop waits for that copy.
    A buffer comes back once the writer is done with it; at most ``keep`` idle ones are kept.
    """

    def __init__(self, keep: int = 4):
        self._idle: list[bytearray] = []
        self._keep = keep
        self._lock = threading.Lock()

    def copy(self, tensors: Mapping[str, object]) -> memoryview:
        """The canonical bytes of ``tensors``, copied into a reused buffer."""
        parts = views(tensors)
        size = sum(len(part) for part in parts)
        target = memoryview(self._take(size))[:size]
        offset = 0
        for part in parts:
            target[offset : offset + len(part)] = part
            offset += len(part)
        return target

    def give_back(self, view: memoryview | bytes) -> None:
        """Return the buffer behind a :meth:`copy` result; its bytes may then be overwritten."""
        if isinstance(view, memoryview) and isinstance(buffer := view.obj, bytearray):
            view.release()
            with self._lock:
                if len(self._idle) < self._keep:
                    self._idle.append(buffer)

    def _take(self, size: int) -> bytearray:
        with self._lock:  # by identity: ``list.remove`` would compare the buffers' bytes
            fitting = [b for b in self._idle if len(b) >= size]
            if fitting:
                chosen = min(fitting, key=len)
                self._idle = [b for b in self._idle if b is not chosen]
                return chosen
            if self._idle:  # all too small (a growing replay buffer): let the largest go
                largest = max(self._idle, key=len)
                self._idle = [b for b in self._idle if b is not largest]
        return bytearray(size + size // 4)  # headroom, so a slowly growing state reuses it


@dataclass(frozen=True)
class SerializedState:
    """The canonical bytes of a state's two parts: a stable copy, safe to keep while training goes on.

    A state with tensors on a GPU is copied asynchronously (``jobs/host_copy.py``): its bytes are
    complete once :meth:`wait` returns, which the writer calls before hashing them.
    """

    weights: memoryview | bytes
    rest: memoryview | bytes
    pending: tuple[HostCopy, ...] = ()
    device: str = "cpu"
    """The kind of device the state's tensors were on (``jobs/devices.py``)."""

    @classmethod
    def of(
        cls, state: TrainState, buffers: StateBuffers | None = None, copier: DeviceCopier | None = None
    ) -> SerializedState:
        if copier is not None and (has_device_tensors(state.weights) or has_device_tensors(state.rest)):
            weights, rest = copier.copy(state.weights), copier.copy(state.rest)
            return cls(weights.view, rest.view, (weights, rest), "cuda")
        if buffers is None:
            return cls(serialize(state.weights), serialize(state.rest), device=state_device_kind(state.weights, state.rest))
        return cls(buffers.copy(state.weights), buffers.copy(state.rest))

    def wait(self) -> None:
        """Block until the bytes are all there (at once for a CPU state)."""
        for copy in self.pending:
            copy.wait()


class SegmentWriter:
    def __init__(self, root: Path, *, job_id: str, recipe: str, k: int, budget_bytes: int | None = None, used_bytes: int = 0):
        self.root, self.job_id, self.recipe, self.k = Path(root), job_id, recipe, k
        self.budget_bytes, self.used_bytes = budget_bytes, used_bytes
        """The disk the kept segments may take (``checkpoint.max_disk_gb``), and what they take so far."""
        self._error: BaseException | None = None
        self._tasks: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=2)
        self._buffers = StateBuffers()
        self._copier: DeviceCopier | None = None
        self.device = "cpu"
        """``cuda`` once a state with tensors on a GPU was captured."""
        self._thread = threading.Thread(target=self._work, name="trainmaster-checkpoint", daemon=True)
        self._thread.start()

    def capture(self, state: TrainState) -> SerializedState:
        """Copy ``state`` in canonical form into buffers this writer reuses once it has written them
        (a GPU state's into pinned buffers, asynchronously: ``jobs/host_copy.py``)."""
        if self._copier is None and (has_device_tensors(state.weights) or has_device_tensors(state.rest)):
            self._copier = DeviceCopier()
        captured = SerializedState.of(state, self._buffers, self._copier)
        if captured.device != "cpu":
            self.device = captured.device
        return captured

    def write(self, index: int, state: SerializedState, trace: DecisionTrace, keep: bool = True) -> None:
        """Queue segment ``index``: S_index (serialized when it was reached) and its trace; with ``keep``
        false its files are hashed into the leaf and not written."""
        self._raise_error()
        step = index * self.k

        def task() -> None:
            try:
                state.wait()  # a GPU state's asynchronous copy is complete before a byte is hashed
                trace_bytes = serialize(trace.to_tensors())
                if keep:
                    self._reserve(index, len(state.weights) + len(state.rest) + len(trace_bytes))
                write_segment_bytes(
                    self.root, index, [state.weights], [state.rest], [trace_bytes],
                    job_id=self.job_id, recipe=self.recipe, step=step, k=self.k, device=state.device, keep=keep,
                )
            finally:
                self._give_back(state.weights)
                self._give_back(state.rest)

        self._tasks.put(task)

    def _reserve(self, index: int, size: int) -> None:
        if self.budget_bytes is not None and self.used_bytes + size > self.budget_bytes:
            raise CheckpointError(
                f"keeping segment {index} would make the kept states {(self.used_bytes + size) / 1e9:.3g} GB, over "
                f"checkpoint.max_disk_gb = {self.budget_bytes / 1e9:.3g}: keep fewer (raise checkpoint.keep_every) "
                "or allow more disk"
            )
        self.used_bytes += size

    def _give_back(self, view: memoryview | bytes) -> None:
        if self._copier is None or not self._copier.give_back(view):
            self._buffers.give_back(view)

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
