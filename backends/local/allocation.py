"""What a local job holds of this machine while it runs: GPUs exclusively, CPUs and memory by request.

Pure functions over an inventory (`hardware.Machine`) and the claims held now. The broker calls `fit`
inside one store transaction (BEGIN IMMEDIATE) that reads the held claims and writes the new one, so
two processes dispatching at once see each other's claims: no GPU index is handed out twice, and no
more CPUs or memory than the machine has. A job that does not fit now waits in the broker's queue.

A job on CPU claims `max(cpus, processes)` cores (each training process needs one); memory is claimed
only when the spec asks for it (`resources.memory_gb`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trainmaster.backends.hardware import Gpu, Machine
from trainmaster.jobs.spec import JobSpec


@dataclass(frozen=True)
class Claim:
    """What one attempt holds: cores, MB of memory, and the indices of its GPUs."""

    cpus: int
    memory_mb: int = 0
    gpus: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        return {"cpus": self.cpus, "memory_mb": self.memory_mb, "gpus": list(self.gpus)}

    @classmethod
    def of(cls, data: dict) -> Claim:
        return cls(cpus=int(data["cpus"]), memory_mb=int(data.get("memory_mb", 0)),
                   gpus=tuple(int(i) for i in data.get("gpus", ())))


@dataclass(frozen=True)
class Fit:
    """The claim a job gets now, or (claim None) why it must wait."""

    claim: Claim | None
    why: str = ""


def eligible_gpus(machine: Machine, spec: JobSpec) -> list[Gpu]:
    """The machine's GPUs of a type and size the job accepts, in index order."""
    res = spec.resources
    return [
        g for g in machine.gpus
        if (not res.gpu_types or any(t.lower() in g.name.lower() for t in res.gpu_types))
        and (not res.min_vram_gb or g.memory_mb >= res.min_vram_gb * 1000)
    ]


def wanted_cpus(spec: JobSpec) -> int:
    res = spec.resources
    return res.cpus if res.gpus else max(res.cpus, res.nproc)


def fit(machine: Machine, spec: JobSpec, held: Iterable[Claim]) -> Fit:
    """The claim `spec` gets beside the `held` ones, or why it does not fit now."""
    held = list(held)
    res = spec.resources
    free_cpus = machine.cpus - sum(c.cpus for c in held)
    free_mb = machine.memory_mb - sum(c.memory_mb for c in held)
    taken = {i for c in held for i in c.gpus}
    gpus = [g.index for g in eligible_gpus(machine, spec) if g.index not in taken][: res.gpus]
    cpus, memory_mb = wanted_cpus(spec), (res.memory_gb or 0) * 1024
    short = []
    if len(gpus) < res.gpus:
        short.append(f"{res.gpus} GPU(s) asked, {len(gpus)} suitable free (held: {_indices(taken)})")
    if cpus > free_cpus:
        short.append(f"{cpus} CPU(s) asked, {max(0, free_cpus)} of {machine.cpus} free")
    if memory_mb > free_mb:
        short.append(f"{res.memory_gb} GB of memory asked, {max(0, free_mb) // 1024} GB of "
                     f"{machine.memory_mb // 1024} GB free")
    if short:
        return Fit(None, "; ".join(short))
    return Fit(Claim(cpus=cpus, memory_mb=memory_mb, gpus=tuple(gpus)))


def _indices(taken: set[int]) -> str:
    return ", ".join(map(str, sorted(taken))) or "none"
