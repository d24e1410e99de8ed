"""What the sampled tier's boundary checks measured (stored with the verdict; no torch here)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Measurement(BaseModel):
    """One check at one boundary or segment: what was measured, against which bound."""

    model_config = ConfigDict(ser_json_inf_nan="strings")
    check: str
    at: int = Field(description="the boundary (exact fields) or segment (the others)")
    measured: float | str | None
    bound: str
    passed: bool


class BoundaryReport(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="strings")
    tier: str = "sampled"
    passed: bool
    reasons: list[str]
    boundaries: int = Field(description="boundaries opened and tied to the root")
    chunks: int = Field(description="chunks opened in all")
    bytes_opened: int
    per_boundary: dict[int, list[str]] = Field(description="boundary -> its opened chunks, as file:index")
    measurements: list[Measurement]
