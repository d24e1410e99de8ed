"""The miner's settings, `miner.yaml` in its home (or --config): what it charges, how long a quote holds,
how much it takes on (concurrent jobs, bundle size, disk), whom it serves (an allowlist, a minimum stake on a
subnet's metagraph, or both), and the inventory its local
backend allocates. Loaded with jobs/yamlfile, so a mistake is reported as `file:line: field: why`."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trainmaster.backends.bittensor.metagraph import stake_rao
from trainmaster.backends.local.config import LocalConfig
from trainmaster.jobs.yamlfile import load_model

FILENAME = "miner.yaml"
CPU = "cpu"
"""The price key of a job that asks for no GPU."""


class Prices(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rao_per_gpu_hour: dict[str, int] = Field(
        default_factory=dict,
        description="GPU type (as the local backend names it, e.g. H100) or `cpu` -> rao per GPU-hour "
                    "(a job pays it × max(GPUs, 1) × its hours).")

    @field_validator("rao_per_gpu_hour")
    @classmethod
    def _whole_rao(cls, prices: dict[str, int]) -> dict[str, int]:
        for name, rao in prices.items():
            if rao < 0:
                raise ValueError(f"{name}: a price is never negative")
        return prices


class MinerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prices: Prices = Field(default_factory=Prices)
    default_hours: float = Field(1.0, gt=0, description="Hours priced when a spec gives neither estimated_hours "
                                                       "nor limits.max_hours.")
    quote_valid_s: int = Field(120, ge=1, le=86_400, description="How long a quote holds.")
    max_concurrent_jobs: int = Field(1, ge=1, description="Attempts run at once; one more is refused (503).")
    max_bundle_mb: int = Field(2048, ge=1, description="The largest bundle accepted (MiB).")
    max_disk_gb: float | None = Field(None, gt=0, description="Bundles and attempt folders may take at most this "
                                                              "(GiB); past it uploads and dispatches are refused.")
    allow: list[str] = Field(default_factory=list, description="Broker hotkeys served (ss58); empty: anyone who signs.")
    min_caller_stake_tao: str | None = Field(
        None, pattern=r"^[0-9]+(\.[0-9]{1,9})?$",
        description="Serve only callers whose hotkey holds at least this stake (TAO, as text: `\"1.5\"`) on subnet "
                    "`netuid` of `network`, as its metagraph reports it; none: no stake rule.")
    network: str = Field("finney", description="The chain whose metagraph the stake rule reads (finney, test, local "
                                               "or a ws:// URL).")
    netuid: int | None = Field(None, ge=0, description="The subnet whose metagraph the stake rule reads.")
    stake_refresh_s: int = Field(300, ge=1, le=86_400, description="Stakes are read from the chain at most this "
                                                                  "often and kept in between.")
    confine: bool = Field(True, description="Run each job as its own unprivileged user in a private view of the "
                                            "files, without the miner's home, wallet or other jobs (needs root). "
                                            "false runs jobs as the miner's own user: they can read all it can.")
    local: LocalConfig = Field(default_factory=LocalConfig,
                               description="The local backend's settings (its inventory: cpus, memory_gb, gpus).")

    @model_validator(mode="after")
    def _stake_on_a_subnet(self) -> MinerConfig:
        if self.min_caller_stake_tao is not None and self.netuid is None:
            raise ValueError("min_caller_stake_tao needs netuid: the stake on which subnet?")
        return self

    @property
    def min_caller_stake_rao(self) -> int | None:
        return None if self.min_caller_stake_tao is None else stake_rao(self.min_caller_stake_tao)

    @property
    def max_bundle_bytes(self) -> int:
        return self.max_bundle_mb << 20

    @property
    def max_disk_bytes(self) -> int | None:
        return None if self.max_disk_gb is None else int(self.max_disk_gb * (1 << 30))


def load_config(home: Path, path: Path | None = None) -> MinerConfig:
    """The settings in `path`, else in `<home>/miner.yaml`, else the defaults; FileError when one is wrong
    (a missing --config is an error, a missing miner.yaml in the home is not)."""
    if path is not None:
        return load_model(path, MinerConfig)
    default = home / FILENAME
    return load_model(default, MinerConfig) if default.exists() else MinerConfig()
