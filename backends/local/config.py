"""The local backend's settings (`local:` in backends.yaml): what your own power costs, where job
virtualenvs are cached, and, when set, the inventory it allocates instead of the one it detects
(fewer CPUs than the machine has, to leave some free; a GPU list, for a machine NVML cannot see)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from trainmaster.backends.base import BackendConfig
from trainmaster.backends.power import PowerModel


class GpuEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="The GPU's model name (e.g. A100).")
    memory_gb: int = Field(ge=1, description="Its memory in GB.")


class LocalConfig(BackendConfig):
    overridable = ("power",)  # a policy may price your own machine its own way (policy `power:`)

    power: PowerModel = Field(default_factory=PowerModel, description="Prices runs on this machine.")
    envs_dir: str | None = Field(None, description="Where `environment: requirements` virtualenvs are cached.")
    cpus: int | None = Field(None, ge=1, description="CPU cores jobs may hold at once; default: all detected.")
    memory_gb: int | None = Field(None, ge=1, description="Memory jobs may hold at once; default: all detected.")
    gpus: list[GpuEntry] | None = Field(
        None, description="The GPUs to allocate, index 0 first; default: detected (NVML and torch.cuda).")
