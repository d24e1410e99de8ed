"""Canonical host copies of a state whose tensors live on a GPU, made while training goes on.

At a segment boundary the training thread must hand the writer a copy of S_i that later steps
cannot change. For CPU tensors that is one memcpy into a reused buffer (``writer.StateBuffers``).
For CUDA tensors, a synchronous ``.cpu()`` of every tensor would block the loop for the whole
device-to-host transfer (a 1 GB state of an 86M-parameter model with Adam: tens of ms at PCIe
speed, more into pageable memory). Instead, per device:

1. on the training stream, right after the step that reached the boundary, each tensor's bytes are
   copied into one flat device snapshot (device-to-device, a few TB/s: well under a millisecond
   for 1 GB on an H200), so the next steps may change the live tensors at once; the snapshot is
   reused at the next boundary, once the GPU has finished copying out of it (the training stream
   waits for that event, long past by then: one state's worth of device memory in all);
2. a side stream waits for that copy, then moves the snapshot into a **pinned** host buffer (the
   canonical file: header, then every tensor's bytes in sorted name order) with asynchronous
   copies, overlapping the next steps' compute; an event marks the end;
3. the writer thread waits for that event (:meth:`HostCopy.wait`) before it hashes and writes the bytes.

When the device has no memory left for the snapshot, the side stream copies straight from the live
tensors and the training stream waits for it (the GPU pauses for the transfer; the Python thread
does not). CPU tensors of the same state are copied at once. Pinned buffers are reused once written
(allocating pinned memory costs far more than the copy). The bytes are exactly
:func:`trainmaster.jobs.canonical.serialize`'s (tests/jobs/test_devices.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from .canonical import CanonicalError, canonical_layout, header_bytes, tensor_bytes

Wait = Callable[[], None]


@dataclass
class HostCopy:
    """The canonical bytes of one part of a state, complete once :meth:`wait` returns."""

    view: memoryview
    events: list = field(default_factory=list)
    keep: list = field(default_factory=list)
    """Device snapshots the side stream still reads: alive until the copy is done."""

    def wait(self) -> None:
        for event in self.events:
            event.synchronize()
        self.events.clear()
        self.keep.clear()


class PinnedBuffers:
    """Pinned host buffers, reused once the writer has written what was copied into them."""

    def __init__(self, keep: int = 4):
        self._idle: list[torch.Tensor] = []
        self._owners: dict[int, torch.Tensor] = {}
        self._keep = keep
        self._lock = threading.Lock()

    def take(self, size: int) -> tuple[torch.Tensor, memoryview]:
        """A pinned uint8 tensor of at least ``size`` bytes and a byte view of its first ``size``."""
        with self._lock:  # (by identity: ``list.remove`` compares tensors with ``==``, elementwise, and fails)
            fitting = [b for b in self._idle if b.numel() >= size]
            chosen = min(fitting, key=torch.Tensor.numel) if fitting else None
            if chosen is not None:
                self._idle = [b for b in self._idle if b is not chosen]
            elif self._idle:
                largest = max(self._idle, key=torch.Tensor.numel)
                self._idle = [b for b in self._idle if b is not largest]
        if chosen is None:  # pinned where a GPU can copy into it asynchronously; plain memory without one
            chosen = torch.empty(max(size + size // 4, 1), dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        array = chosen.numpy()
        view = memoryview(array)[:size]
        with self._lock:
            self._owners[id(array)] = chosen
        return chosen, view

    def owns(self, view: memoryview | bytes) -> bool:
        return isinstance(view, memoryview) and id(view.obj) in self._owners

    def give_back(self, view: memoryview | bytes) -> None:
        if not isinstance(view, memoryview):
            return
        with self._lock:
            buffer = self._owners.pop(id(view.obj), None)
        if buffer is None:
            return
        view.release()
        with self._lock:
            if len(self._idle) < self._keep:
                self._idle.append(buffer)


def has_device_tensors(tensors: Mapping[str, object]) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in tensors.values())


class DeviceCopier:
    """Makes :class:`HostCopy` objects of states with CUDA tensors: one side stream and one reused device
    snapshot per device (overwritten only once the previous copy out of it is done, a wait the GPU makes,
    not the Python thread)."""

    def __init__(self, buffers: PinnedBuffers | None = None):
        self.buffers = buffers or PinnedBuffers()
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._snapshots: dict[torch.device, torch.Tensor] = {}
        self._read: dict[torch.device, torch.cuda.Event] = {}
        """The event after which the side stream has read a device's snapshot."""

    def copy(self, tensors: Mapping[str, object]) -> HostCopy:
        """Start copying the canonical bytes of ``tensors`` into a pinned buffer (see the module docstring)."""
        ordered = canonical_layout(tensors)
        header = header_bytes(ordered)
        sizes = [t.numel() * t.element_size() for t in ordered.values()]
        total = len(header) + sum(sizes)
        pinned, view = self.buffers.take(total)
        view[: len(header)] = header
        copy = HostCopy(view)
        on_device: dict[torch.device, list[tuple[torch.Tensor, int, int]]] = {}
        offset = len(header)
        for (name, tensor), size in zip(ordered.items(), sizes, strict=True):
            if tensor.device.type == "cpu":
                if size:
                    view[offset : offset + size] = tensor_bytes(tensor)
            elif tensor.device.type == "cuda":
                if size:
                    on_device.setdefault(tensor.device, []).append((tensor, offset, size))
            else:
                self.buffers.give_back(view)
                raise CanonicalError(f"state entry {name!r} is on {tensor.device}, which the runtime cannot copy")
            offset += size
        for device, parts in on_device.items():
            self._start(device, parts, pinned, copy)
        return copy

    def give_back(self, view: memoryview | bytes) -> bool:
        """Return a pinned buffer behind ``view``; False when ``view`` is not one of them."""
        if not self.buffers.owns(view):
            return False
        self.buffers.give_back(view)
        return True

    def _snapshot(self, device: torch.device, size: int, training: torch.cuda.Stream) -> torch.Tensor | None:
        """The device's snapshot buffer, at least ``size`` bytes, free to overwrite on the training stream."""
        read = self._read.get(device)
        if read is not None:
            training.wait_event(read)  # the side stream's last copy out of it comes first
        snapshot = self._snapshots.get(device)
        if snapshot is None or snapshot.numel() < size:
            self._snapshots.pop(device, None)  # (the old one is read by then: the wait above orders its reuse)
            try:
                snapshot = torch.empty(size, dtype=torch.uint8, device=device)
            except torch.cuda.OutOfMemoryError:
                return None
            self._snapshots[device] = snapshot
        return snapshot

    def _start(self, device: torch.device, parts: list[tuple[torch.Tensor, int, int]], pinned: torch.Tensor, copy: HostCopy) -> None:
        side = self._streams.get(device)
        if side is None:
            side = self._streams[device] = torch.cuda.Stream(device)
        training = torch.cuda.current_stream(device)
        snapshot = self._snapshot(device, sum(size for _, _, size in parts), training)
        if snapshot is not None:  # 1. device-to-device on the training stream, in its order
            sources, at = [], 0
            for tensor, _, size in parts:
                target = snapshot[at : at + size]
                target.copy_(_raw(tensor))
                sources.append(target)
                at += size
        else:  # no memory for a snapshot: the side stream reads the live tensors
            sources = [_raw(tensor) for tensor, _, _ in parts]
            copy.keep.extend(sources)
        side.wait_stream(training)
        with torch.cuda.stream(side):  # 2. device-to-host into the pinned file, overlapping the next steps
            for source, (_, offset, size) in zip(sources, parts, strict=True):
                pinned[offset : offset + size].copy_(source, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        if snapshot is None:  # the next steps may change the live tensors only once they are read
            training.wait_stream(side)
        else:
            self._read[device] = done
        copy.events.append(done)


def _raw(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as a flat uint8 tensor on its device (a C-order copy when it is not contiguous)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)
