"""The local backend's settings (`local:` in backends.yaml): what your own power costs, where job
virtualenvs are cached, and, when set, the inventory it allocates instead of the one it detects
(fewer CPUs than the machine has, to leave some free; a GPU list, for a machine NVML cannot see); and,
for a machine that runs strangers' jobs (a Bittensor miner), the `sandbox` each job is confined by
(sandbox.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trainmaster.backends.base import BackendConfig
from trainmaster.backends.power import PowerModel


class GpuEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="The GPU's model name (e.g. A100).")
    memory_gb: int = Field(ge=1, description="Its memory in GB.")


class Sandbox(BaseModel):
    """How each job is confined (backends/local/sandbox.py): its own unprivileged user, a view of the
    files without `hide` and the home, resource limits, and no network unless `network` is set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uid: int | None = Field(None, ge=1, description="The user every job runs as; default: one of its own per "
                                                     "attempt, from FIRST_UID on, so two jobs never share one.")
    gid: int | None = Field(None, ge=1, description="Its group; default: the same number as its user.")
    hide: list[str] = Field(default_factory=list, description="Absolute paths the job must not see at all "
                                                              "(the miner's home, its wallet folder).")
    memory_mb: int | None = Field(None, ge=64, description="Its address space (RLIMIT_AS); default: unlimited.")
    open_files: int = Field(4096, ge=16, description="Open files per process (RLIMIT_NOFILE).")
    processes: int = Field(512, ge=1, description="Processes and threads of its user (RLIMIT_NPROC).")
    file_size_gb: int = Field(64, ge=1, description="The largest file it may write (RLIMIT_FSIZE).")
    network: bool = Field(False, description="Keep the machine's network; default: only a loopback of its own.")

    @field_validator("hide")
    @classmethod
    def _absolute(cls, paths: list[str]) -> list[str]:
        if bad := [p for p in paths if not p.startswith("/")]:
            raise ValueError(f"hide: paths must be absolute: {', '.join(bad)}")
        return paths


class LocalConfig(BackendConfig):
    overridable = ("power",)  # a policy may price your own machine its own way (policy `power:`)

    power: PowerModel = Field(default_factory=PowerModel, description="Prices runs on this machine.")
    envs_dir: str | None = Field(None, description="Where `environment: requirements` virtualenvs are cached.")
    cpus: int | None = Field(None, ge=1, description="CPU cores jobs may hold at once; default: all detected.")
    memory_gb: int | None = Field(None, ge=1, description="Memory jobs may hold at once; default: all detected.")
    gpus: list[GpuEntry] | None = Field(
        None, description="The GPUs to allocate, index 0 first; default: detected (NVML and torch.cuda).")
    sandbox: Sandbox | None = Field(None, description="Confine each job (needs root); default: jobs run as you.")
    inherit_env: list[str] = Field(
        default_factory=list, description="Variables (NAME, or PREFIX* patterns) a job inherits from the broker's "
        "environment beyond the documented allowlist (jobs/inherited.py); names that look like secrets "
        "(TRAINMASTER_*, *TOKEN*, *PASSWORD*, *_KEY …) never are.")
