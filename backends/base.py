"""The Backend protocol: every place a run can execute speaks it, and the broker speaks nothing else.

A backend lists offers for an `OfferRequest` (the spec with the policy's constraints, the catalog
settings, the broker's TAO/USD rate, the data sizes and the job's total steps); the broker records
each answer's quote (`Quoting`: who answered, when, until when, the rate) and stamps the chosen offer
with it (`valid_until`, `quote`), and re-quotes an offer that expired before dispatch. A backend
starts an attempt from a bundle, reports status and logs, cancels, fetches the outputs and says what
the attempt cost. What it cannot do is declared as data (`backends.features`), so the broker can
explain why a backend was left out (`broker.gating`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainmaster.jobs.spec import JobSpec
from trainmaster.wallet.rates import Rate, RateProvider


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
    job_price_micro_usd: int | None = Field(None, ge=0, description="A fixed price for the job's whole work (a "
                                                                   "miner's signed quote), planned and paid instead "
                                                                   "of the hourly price × hours.")
    job_price_rao: int | None = Field(None, ge=0, description="That fixed price in rao, as the executor quoted it.")
    trusted: bool = Field(False, description="Runs on compute we control; untrusted offers get the replay audit. "
                                             "Stamped by the broker from the registry, never taken from a backend.")
    detail: dict[str, Any] = Field(default_factory=dict)
    valid_until: float | None = Field(None, description="Unix time the price stops holding; the broker sets it "
                                                        "(the policy's `offers.valid_s`) when a backend does not, "
                                                        "and re-quotes an expired offer before dispatch.")
    quote: dict[str, Any] = Field(default_factory=dict, description="Evidence of the price: from what "
                                                                    "(`source`, the backend's word), and, stamped by "
                                                                    "the broker, who quoted it (`by`), when (`at`) "
                                                                    "and the TAO rate it used.")

    def expired(self, now: float) -> bool:
        return self.valid_until is not None and now >= self.valid_until

    @property
    def key(self) -> str:
        """Identifies the offer across re-plans (for blocking a failed one)."""
        return f"{self.backend}/{self.region}/{self.instance}/{'spot' if self.spot else 'on-demand'}"


class Quoting(Frozen):
    """The broker's record of one backend's answer: who answered, when, how long its prices hold unless an
    offer says less, and the TAO/USD rate the request carried (with when it was taken, and whether stale)."""

    by: str
    at: float
    valid_until: float
    rate: dict[str, Any] = Field(default_factory=dict)

    def stamp(self, offer: Offer) -> Offer:
        """`offer` with its validity (its own, when earlier) and its full quote evidence: the source its backend
        named, the rate for a TAO price, and who answered when, which only the broker says."""
        until = self.valid_until if offer.valid_until is None else min(offer.valid_until, self.valid_until)
        source = str(offer.quote.get("source") or offer.detail.get("price_source") or "backend")
        rate = self.rate if offer.price_per_hour_rao is not None else {}
        return offer.model_copy(update={"valid_until": until,
                                        "quote": {"source": source, **rate, "by": self.by, "at": self.at}})


class OfferConstraints(Frozen):
    """The policy's constraints on offers, so a backend can leave out what would be filtered anyway."""

    spot_allowed: bool = True
    regions: list[str] | None = None
    gpu_types: list[str] | None = None
    max_usd_per_hour_micro: int | None = None


class CatalogSettings(Frozen):
    """Where a catalog-priced backend reads its prices, and when they are too old to trust silently."""

    override_dir: str | None = Field(None, description="Folder of the user's own catalog files.")
    refreshed_dir: str | None = Field(None, description="Folder of the prices `trainmaster catalog refresh` pulled "
                                                        "(laid between the shipped catalogs and the user's own).")
    max_age_days: int = Field(90, ge=1)


class OfferRequest(Frozen):
    """What the broker asks a backend to price: the spec and everything around it that changes a price."""

    spec: JobSpec
    constraints: OfferConstraints = Field(default_factory=OfferConstraints)
    catalog: CatalogSettings = Field(default_factory=CatalogSettings)
    rate: Rate | None = Field(None, description="TAO/USD from the broker's rate provider (TAO-priced backends).")
    data_bytes: dict[str, int] = Field(default_factory=dict, description="Size of each data source, by name.")
    total_steps: int | None = Field(None, description="T, the job's training steps (its `--steps`).")


class OfferSet(Frozen):
    """A backend's answer for one request: its offers, or why it has none."""

    backend: str
    offers: list[Offer] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list, description="Why the spec cannot run here, when it cannot.")
    quoting: Quoting | None = Field(None, description="Set by the broker when it received the answer: the evidence "
                                                      "and validity every offer of it carries once chosen.")


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


class Cause(str, Enum):
    """Why an attempt stopped without succeeding: what the broker's one reaction (`broker.failures`) keys on."""

    script_failed = "script_failed"
    """The job's own code failed (a non-zero exit, killed for its memory, its time limit): no fallback helps."""
    preempted = "preempted"
    """The provider took the machine back (spot): tried again on the same offer, resuming, then elsewhere."""
    capacity = "capacity"
    """The offer could not hold the run (no instance, no free GPU, a quota): the offer is blocked, the next tried."""
    lost = "lost"
    """The run vanished (its supervisor or machine died, unreachable past the policy's deadline): as preempted."""
    cancelled = "cancelled"
    """Stopped on request (the user, a cost cap)."""


class AttemptStatus(Frozen):
    phase: Phase
    cause: Cause | None = Field(None, description="Why a failed or cancelled attempt ended (None while it runs "
                                                  "or once it succeeded; a backend that cannot tell leaves it None).")
    reason: str | None = None
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None


class OutputFile(Frozen):
    path: str = Field(description="Relative to the outputs folder.")
    size: int
    sha256: str


class Cost(Frozen):
    """What an attempt actually cost. TAO costs carry the exchange rate and when it was taken, so the
    ledger can record both the rao paid and its micro-USD value at that moment."""

    micro_usd: int = Field(ge=0)
    rao: int = Field(0, ge=0)
    rate_micro_usd_per_tao: int | None = Field(None, gt=0, description="Required when rao > 0.")
    rate_at: float | None = Field(None, description="Unix time the rate was taken.")
    billable_seconds: float = Field(ge=0)
    basis: str = Field(description="How it was computed, for the record.")

    @model_validator(mode="after")
    def _rate_with_rao(self) -> Cost:
        if self.rao and (self.rate_micro_usd_per_tao is None or self.rate_at is None):
            raise ValueError("a cost in rao needs the exchange rate and the time it was taken")
        return self


class AttemptContext(Frozen):
    """What the broker tells a backend about the attempt it is starting."""

    job_id: str
    attempt_id: str
    bundle_sha256: str
    seed: int
    workdir: str = Field(description="The broker's folder for this attempt; backends keep their scratch here.")
    resume_from: str | None = Field(None, description="A checkpoint to resume from (a previous attempt's).")
    challenge_digest: str | None = Field(
        None, description="sha256 of the attempt's challenge secret, published to the executor at dispatch."
    )
    max_micro_usd: int | None = Field(
        None, description="What the attempt may still spend under the job's limits.max_usd (a backend that can "
                          "stops the run there itself; the broker stops it too when it sees the cap reached).")


class LogChunk(Frozen):
    """A piece of an attempt's log: `text` from byte `offset` on; ask again from `next_offset`."""

    text: str
    offset: int = Field(ge=0)
    next_offset: int = Field(ge=0)
    complete: bool = Field(description="The attempt has ended and nothing follows `next_offset`.")


Progress = Callable[[int, "int | None"], None]
"""Called with (bytes done, bytes in all or None) while a transfer runs."""


class BackendConfig(BaseModel):
    """A backend's settings from the user's config dir (`backends.yaml`, one section per backend)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    overridable: ClassVar[tuple[str, ...]] = ()
    """Fields a policy may set for the jobs planned under it (the policy's field of the same name wins
    over backends.yaml); every other field comes from backends.yaml or its default."""


class BackendError(RuntimeError):
    """A backend could not do what was asked, and asking again will not help; the message says why.

    Each subclass names whose fault it is, and so the broker's one reaction to it (`broker.failures`)."""


class TransientBackendError(BackendError):
    """A failure that may pass (a timeout, a 5xx, a dropped connection): the broker retries the call
    a bounded number of times with jittered backoff (`backends.retry`), then treats it as permanent."""


class ExecutorFault(BackendError):
    """What an executor we do not control sent (or failed to send) is wrong: a short or altered
    stream, a refusal, bytes that do not parse. Its attempt is rejected, unpaid, and it is banned."""


class CapacityError(BackendError):
    """The offer has no capacity now (no instance, no free GPU, a quota): the offer is blocked for the
    job and the policy falls back to the next one."""


class ConfigurationError(BackendError):
    """The backend's own set-up refuses the run, and nothing about this job or offer will change that: a
    missing bucket or container, an execution role it cannot assume or pass, a permission, a quota of zero,
    no credentials. The attempt ends once with the reason, and the backend is not planned again for the job
    (another offer of it would meet the same refusal)."""


class LocalEnvironmentError(BackendError):
    """Our own side failed (a full disk, a folder we cannot write): nobody else is blamed or paid; the
    attempt waits, and the message says what to fix."""


class Backend(abc.ABC):
    """One place runs can execute. Subclasses also inherit the capability mixins they support.

    Its pip extra, SDK modules, trust and readiness check are declared once, in its registry entry
    (`backends.registry.BackendEntry`), never on the class.

    Every method is a coroutine and must not block the event loop (run blocking SDK calls and disk
    work with `asyncio.to_thread`). `submit` is idempotent on `ctx.attempt_id`: called again after a
    crash it finds the run it started instead of starting a second one.
    """

    name: ClassVar[str]
    unsupported: ClassVar[dict[str, str]] = {}
    """Feature name -> why this backend cannot do it (see `backends.features`)."""
    config_model: ClassVar[type[BackendConfig]] = BackendConfig
    exact_replay: ClassVar[bool] = False
    """Runs on the broker's own machine and build, so a replay of its work must match bit for bit."""

    rates: RateProvider | None = None
    """The broker's TAO/USD rate provider, injected by the broker (backends that charge in TAO value
    their costs with it)."""

    progress: Progress | None = None
    """Called as a bundle is uploaded at submit (a remote backend), injected by the broker (the CLI draws it)."""

    def __init__(self, config: BackendConfig | None = None):
        self.config = config if config is not None else self.config_model()

    def lacks(self, request: OfferRequest) -> dict[str, str]:
        """Features this backend supports in general but not for `request` (feature -> why); the broker
        adds them to what its mixins leave out (`broker.gating`)."""
        return {}

    @abc.abstractmethod
    async def offers(self, request: OfferRequest) -> OfferSet:
        """The offers for `request`. Whether the spec needs a feature this backend lacks is the broker's
        check (`broker.gating`), made before this is called."""

    @abc.abstractmethod
    async def submit(self, bundle: Path, spec: JobSpec, offer: Offer, ctx: AttemptContext) -> Handle: ...

    @abc.abstractmethod
    async def status(self, handle: Handle) -> AttemptStatus: ...

    @abc.abstractmethod
    async def logs(self, handle: Handle, offset: int = 0) -> LogChunk: ...

    @abc.abstractmethod
    async def cancel(self, handle: Handle) -> int | None:
        """Stop whatever of the attempt still runs, whatever its recorded state; how many processes it had
        to stop, when the backend can tell (None when it cannot)."""

    @abc.abstractmethod
    async def fetch(self, handle: Handle, dest: Path, progress: Progress | None = None) -> list[OutputFile]:
        """The attempt's outputs into `dest` (atomically: all or nothing), each file hashed as it arrives."""

    @abc.abstractmethod
    async def cost(self, handle: Handle, offer: Offer) -> Cost: ...
