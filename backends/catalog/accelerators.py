"""Vertex AI's accelerator names for the GPUs of the gcp catalog: a Vertex custom job takes a machine type
and, beside it, an accelerator type and count (`n1-standard-8` + `NVIDIA_TESLA_T4` x 1)."""

from __future__ import annotations

VERTEX = {"T4": "NVIDIA_TESLA_T4", "V100": "NVIDIA_TESLA_V100", "P100": "NVIDIA_TESLA_P100", "P4": "NVIDIA_TESLA_P4",
          "L4": "NVIDIA_L4", "H100": "NVIDIA_H100_80GB", "H200": "NVIDIA_H200_141GB"}
A100 = {40: "NVIDIA_TESLA_A100", 80: "NVIDIA_A100_80GB"}


def vertex_accelerator(gpu_type: str, gpu_memory_gb: int | None) -> str:
    """The AcceleratorType name Vertex takes for a catalog GPU; ValueError for one Vertex does not offer."""
    name = A100.get(gpu_memory_gb or 40) if gpu_type == "A100" else VERTEX.get(gpu_type)
    if name is None:
        raise ValueError(f"Vertex AI offers no {gpu_type} ({gpu_memory_gb} GB) accelerator")
    return name
