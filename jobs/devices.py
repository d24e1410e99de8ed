"""Where a recipe computes: its ``device`` option, the device a replay runs on, and what a run records of it.

A recipe keeps its model, optimizer and data on any torch device; the runtime's own work (the
canonical copies, the hashes, every comparison) happens on host copies. Three things live here:

* :func:`resolve_device` turns a recipe's ``device`` option into a ``torch.device``: ``auto`` is CUDA
  when the job has a GPU (``torch.cuda.is_available()``, which honours the ``CUDA_VISIBLE_DEVICES``
  a backend sets, so a job given no GPU sees none), else the CPU; ``cpu`` and ``cuda`` are taken as
  written. A verifier re-executes a segment on the device *it* has: inside :func:`replaying_on` every
  option resolves to that device (the audit, its child process, calibration), so a state committed on
  a GPU is replayed on a CPU verifier by the same recipe code.
* :func:`prepare_determinism` pins what makes a CUDA step reproducible bit for bit in another process
  on the same GPU type: ``torch.use_deterministic_algorithms(True)`` (an op without a deterministic
  kernel, e.g. an ``atomicAdd`` reduction, raises rather than silently differing),
  ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` and true fp32 (no TF32 in matmuls or convolutions). The runtime
  calls it before building a trainer, in training, the self-check, the audit and calibration alike;
  on a machine without CUDA it changes nothing.
* :func:`device_kind` says which kind of device a state's tensors live on (``cpu`` or ``cuda``); the
  runtime records ``cuda`` in the commitment (``device``) so that the broker knows the (executor,
  verifier) pair whose calibration applies (docs/audit.md, "Devices").

CUDA generators need no entry in S_i: the runtime re-seeds every one of them from ``(seed, step)``
before each step (and from the job seed before ``build``), so no step reads a CUDA generator state
that an earlier step left, and a CPU verifier, which has no CUDA generator to reproduce, compares
nothing it cannot compute (docs/runtime.md, "Devices").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Literal

import torch

from .recipe_config import DeviceOption  # re-exported: recipes outside the package name it here
from .settings import SettingsError

DeviceKind = Literal["cpu", "cuda"]
KINDS: tuple[str, ...] = ("cpu", "cuda")
CUBLAS_WORKSPACE = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_DETERMINISTIC = ":4096:8"

_replay_kind: str | None = None


class DeviceError(SettingsError):
    """A device option that cannot be honoured here (``cuda`` on a machine without one)."""


def cuda_available() -> bool:
    """Whether this process may use CUDA (a CPU-only torch build answers at once)."""
    return torch.cuda.is_available()


def resolve_device(option: str = "auto") -> torch.device:
    """The device a recipe whose config says ``option`` computes on in this process (see the module docstring)."""
    if option not in ("auto", "cpu", "cuda"):
        raise DeviceError(f"device {option!r} is not one of auto, cpu, cuda")
    kind = _replay_kind or ("cuda" if option == "auto" and cuda_available() else "cpu" if option == "auto" else option)
    if kind == "cpu":
        return torch.device("cpu")
    if not cuda_available():
        raise DeviceError("device cuda was asked for, but this process sees no CUDA device (CUDA_VISIBLE_DEVICES?)")
    return torch.device("cuda", _local_index())


def _local_index() -> int:
    """The GPU of this process: its ``LOCAL_RANK`` among the visible ones in a run of several, else the current one."""
    count = torch.cuda.device_count()
    rank = os.environ.get("LOCAL_RANK", "")
    if rank.isdigit() and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 and count:
        return int(rank) % count
    return torch.cuda.current_device()


@contextlib.contextmanager
def replaying_on(kind: str | None) -> Iterator[None]:
    """Every recipe's device resolves to ``kind`` (``cpu`` or ``cuda``) inside; None changes nothing."""
    global _replay_kind
    if kind is not None and kind not in KINDS:
        raise DeviceError(f"device kind {kind!r} is not one of {', '.join(KINDS)}")
    if kind == "cuda" and not cuda_available():
        raise DeviceError("a replay on cuda was asked for, but this process sees no CUDA device")
    before, _replay_kind = _replay_kind, kind if kind is not None else _replay_kind
    try:
        yield
    finally:
        _replay_kind = before


def replay_kind() -> str | None:
    """The device kind :func:`replaying_on` set, if any."""
    return _replay_kind


def prepare_determinism() -> None:
    """Make CUDA steps reproducible bit for bit in a fresh process (see the module docstring); no-op without CUDA."""
    if not cuda_available():
        return
    os.environ.setdefault(CUBLAS_WORKSPACE, CUBLAS_DETERMINISTIC)  # read when cuBLAS makes its first handle
    torch.use_deterministic_algorithms(True)
    try:  # filling every new tensor with NaN costs time, and a valid step reads no uninitialised memory
        import torch.utils.deterministic as deterministic

        deterministic.fill_uninitialized_memory = False
    except ImportError:
        pass
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.set_float32_matmul_precision("highest")


def seed_cuda(derived: int) -> None:
    """Seed every CUDA generator (queued by torch until CUDA starts, when it has not yet)."""
    if torch.cuda.is_initialized() or cuda_available():
        torch.cuda.manual_seed_all(derived)


def device_kind(tensors: Iterable[torch.Tensor]) -> DeviceKind:
    """``cuda`` when any of ``tensors`` lives on a CUDA device, else ``cpu``."""
    return "cuda" if any(t.device.type == "cuda" for t in tensors) else "cpu"


def state_device_kind(*parts: Mapping[str, torch.Tensor]) -> DeviceKind:
    """:func:`device_kind` over the tensors of a state's parts."""
    return device_kind(t for part in parts for t in part.values() if isinstance(t, torch.Tensor))


def describe_device(kind: str) -> dict[str, str]:
    """Where a measurement ran: the device kind, and for CUDA the GPU's name, capability and the CUDA/cuDNN versions."""
    found = {"device": kind, "torch": torch.__version__}
    if kind == "cuda" and cuda_available():
        index = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        found.update({
            "gpu": torch.cuda.get_device_name(index),
            "capability": f"{major}.{minor}",
            "cuda": str(torch.version.cuda),
            "cudnn": str(torch.backends.cudnn.version()),
        })
    return found


def fingerprint(kind: str) -> str:
    """The environment a run's deterministic mode computed in, as the commitment records it (``deterministic``):
    ``torch 2.13.0+cpu; cpu AVX2`` on a CPU (the instruction set selects the kernels), and on a GPU
    ``torch …; cuda 12.8; cudnn 91002; NVIDIA H200; cublas :4096:8; cpu AVX512``: a GPU run's W0 is initialised on
    the CPU, so the CPU kernel set that drew it is named too (verify/initial_state.py). Two runs of a job with the
    same fingerprint reach the same bits (the refereed tier compares their roots). Printable ASCII, ≤ 200 chars."""
    parts = [f"torch {torch.__version__}"]
    if kind == "cuda" and cuda_available():
        found = describe_device("cuda")
        parts += [f"cuda {found['cuda']}", f"cudnn {found['cudnn']}", found["gpu"],
                  f"cublas {os.environ.get(CUBLAS_WORKSPACE, CUBLAS_DETERMINISTIC)}"]
    parts.append(f"cpu {cpu_capability()}")  # a GPU run's too: its W0 is drawn on the CPU
    text = "; ".join(parts)
    return "".join(c if " " <= c <= "~" else "?" for c in text)[:200]


def cpu_capability() -> str:
    """The CPU kernel set torch picked at start-up (``DEFAULT``, ``AVX2``, ``AVX512``, …): its vectorized kernels
    (``normal_`` of 16 or more elements among them) draw other bits than the portable ones. ``ATEN_CPU_CAPABILITY``
    chooses a lower one for a process; ``unknown`` when this torch does not tell."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):  # an older torch: the kernels' choice is not told
        return "unknown"


def fingerprint_cpu_kernels(text: str | None) -> str | None:
    """The CPU kernel set a :func:`fingerprint` names (``torch …; cpu AVX2`` → ``AVX2``, a GPU run's last part
    alike); None when it names none (a GPU run committed before it did, or no fingerprint). The text is an executor's: only a plain name (capitals, digits, ``_``) counts."""
    import re

    found = re.search(r"(?:^|; )cpu ([A-Z][A-Z0-9_]{0,31})(?:;|$)", text or "")
    return found[1] if found is not None else None


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for the device's queued work (timings); nothing on a CPU."""
    if torch.device(device or "cpu").type == "cuda":
        torch.cuda.synchronize(device)
