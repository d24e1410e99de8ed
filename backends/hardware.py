"""What this machine has: CPUs, memory, and GPUs (names and memory from NVML, count from torch.cuda).

NVML is asked first because it is cheap; torch (seconds to import) is only consulted when NVML
reports GPUs, to respect CUDA_VISIBLE_DEVICES and confirm that CUDA works from torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from trainmaster.jobs.cpus import usable_cpus


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_mb: int


@dataclass(frozen=True)
class Machine:
    cpus: int
    memory_mb: int
    gpus: tuple[Gpu, ...] = field(default_factory=tuple)


@lru_cache(maxsize=1)
def this_machine() -> Machine:
    return Machine(cpus=this_host().cpus, memory_mb=this_host().memory_mb, gpus=tuple(_gpus()))


@lru_cache(maxsize=1)
def this_host() -> Machine:
    """CPUs and memory only: what is known without asking NVML or torch."""
    import psutil

    return Machine(cpus=usable_cpus(), memory_mb=psutil.virtual_memory().total // 2**20)


def _gpus() -> list[Gpu]:
    nvml = _nvml_gpus()
    if not nvml:
        return []
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return nvml[:count]


def _nvml_gpus() -> list[Gpu]:
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        found = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20
            found.append(Gpu(index=i, name=name, memory_mb=memory))
        return found
    finally:
        pynvml.nvmlShutdown()
