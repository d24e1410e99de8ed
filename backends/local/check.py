"""What `trainmaster backends check` reports about this machine: whether it can run jobs at all (torch
is installed) and what it found (CPUs, memory, GPUs)."""

from __future__ import annotations

from trainmaster.backends.local.config import LocalConfig


def check(config: LocalConfig) -> list[str]:
    """Why this machine cannot run jobs (empty when it can). Cheap: torch is looked up, not imported."""
    import importlib.util

    return [] if importlib.util.find_spec("torch") else ["torch is not installed (pip install torch)"]


def found(config: LocalConfig) -> list[str]:
    """CPUs, memory and GPUs (NVML; torch is imported only when NVML reports GPUs, to confirm CUDA)."""
    from trainmaster.backends.hardware import this_machine

    try:
        machine = this_machine()
    except ImportError:  # NVML sees GPUs but torch is missing: `check` says so
        return []
    notes = [f"{machine.cpus} CPUs, {machine.memory_mb / 1024:.0f} GiB memory"]
    names = sorted({g.name for g in machine.gpus})
    notes.append(f"{len(machine.gpus)} GPUs ({', '.join(names)})" if machine.gpus else "no GPUs (CPU jobs only)")
    return notes
