"""The Backend protocol: every place a run can execute speaks it, and the broker speaks nothing else.

A backend lists offers for a spec (each with its price, recorded at dispatch and used for the
actual cost), starts an attempt from a bundle, reports status and logs, cancels, fetches the
outputs and says what the attempt cost. What it cannot do is declared as data
(`backends.features`), so the planner can explain why a backend was left out.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from trainmaster.jobs.spec import JobSpec


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Offer(Frozen):
    """One way to run a spec on a backend, at a price per hour (integer micro-USD, and rao for TAO)."""

    backend: str
    instance: str = Field(description="Instance type, machine or miner hotkey.")
    region: str = "local"
    gpu_type: str | None = None
    gpu_count: int = 0
    gpu_memory_mb: int | None = None
    cpus: int = 1
    memory_mb: int | None = None
    nodes: int = 1
    spot: bool = False
    price_per_hour_micro_usd: int = Field(ge=0)
    price_per_hour_rao: int | None = Field(None, ge=0, description="For backends paid in TAO.")
    expected_start_s: int = Field(0, ge=0)
    trusted: bool = Field(description="Runs on compute we control; untrusted offers get the replay audit.")
    detail: dict[str, Any] = Field(default_factory=dict)

    @property
    def key(self) -> str:
        """Identifies the offer across re-plans (for blocking a failed one)."""
        return f"{self.backend}/{self.region}/{self.instance}/{'spot' if self.spot else 'on-demand'}"


class OfferSet(Frozen):
    """A backend's answer for one spec: its offers, or why it has none."""

    backend: str
    offers: list[Offer] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list, description="Why the spec cannot run here, when it cannot.")


class Handle(Frozen):
    """What a backend needs to find an attempt again, from any process (stored in SQLite as JSON)."""

    backend: str
    attempt_id: str
    data: dict[str, Any]


class Phase(str, Enum):
    pending = "pending"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def done(self) -> bool:
        return self in (Phase.succeeded, Phase.failed, Phase.cancelled)


class AttemptStatus(Frozen):
    phase: Phase
    reason: str | None = None
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None


class OutputFile(Frozen):
    path: str = Field(description="Relative to the outputs folder.")
    size: int
    sha256: str


class Cost(Frozen):
    micro_usd: int = Field(ge=0)
    rao: int = Field(0, ge=0)
    billable_seconds: float = Field(ge=0)
    basis: str = Field(description="How it was computed, for the record.")


class AttemptContext(Frozen):
    """What the broker tells a backend about the attempt it is starting."""

    job_id: str
    attempt_id: str
    bundle_sha256: str
    seed: int
    workdir: str = Field(description="The broker's folder for this attempt; backends keep their scratch here.")
    resume_from: str | None = Field(None, description="A checkpoint to resume from (a previous attempt's).")


class BackendError(RuntimeError):
    """A backend could not do what was asked; the message says why."""


class Backend(abc.ABC):
    """One place runs can execute. Subclasses also inherit the capability mixins they support."""

    name: ClassVar[str]
    trusted: ClassVar[bool]
    unsupported: ClassVar[dict[str, str]] = {}
    """Feature name -> why this backend cannot do it (see `backends.features`)."""

    @abc.abstractmethod
    async def offers(self, spec: JobSpec) -> OfferSet: ...

    @abc.abstractmethod
    def submit(self, bundle: Path, spec: JobSpec, offer: Offer, ctx: AttemptContext) -> Handle: ...

    @abc.abstractmethod
    def status(self, handle: Handle) -> AttemptStatus: ...

    @abc.abstractmethod
    def logs(self, handle: Handle, *, follow: bool = False) -> Iterator[str]: ...

    @abc.abstractmethod
    def cancel(self, handle: Handle) -> None: ...

    @abc.abstractmethod
    def fetch(self, handle: Handle, dest: Path) -> list[OutputFile]: ...

    @abc.abstractmethod
    def cost(self, handle: Handle, offer: Offer) -> Cost: ...
