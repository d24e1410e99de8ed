"""The power model that prices runs on your own machines: watts drawn × the price of a kWh."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PowerModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    usd_per_kwh_micro: int = Field(150_000, ge=0, description="Electricity price, micro-USD per kWh ($0.15).")
    gpu_watts: int = Field(300, ge=0, description="Draw per busy GPU.")
    host_watts: int = Field(120, ge=0, description="Draw of the host (CPUs, memory, fans) while a job runs.")

    def price_per_hour_micro(self, gpus: int) -> int:
        """micro-USD per hour for a run on `gpus` GPUs (kWh per hour = watts / 1000)."""
        watts = self.host_watts + gpus * self.gpu_watts
        return (watts * self.usd_per_kwh_micro + 999) // 1000
