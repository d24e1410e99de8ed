"""Cost policies: per workload class, where runs may go and how the planner chooses among offers.

The shipped policies live in `configs/` (package data); a name is looked up in the user config
dir first, then there. `default` is the embedded default: local only. The file format is
documented in docs/policy.md.

A class names a primary and ordered fallbacks. Each is a *tier*: one step (`aws`, `aws:spot`,
`gcp:on-demand`) or a list of steps the objective chooses among (`[aws:spot, gcp:spot]`). The
planner uses the first tier that has an acceptable offer, so a fallback is only used when every
tier before it has nothing left (no offers, all filtered, or all blocked after failures).
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from fnmatch import fnmatchcase
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from trainmaster.backends.power import PowerModel
from trainmaster.backends.registry import NAMES as KNOWN_BACKENDS
from trainmaster.broker import paths
from trainmaster.jobs.spec import Usd, Workload
from trainmaster.jobs.userfile import is_regular_file
from trainmaster.jobs.yamlfile import FileError, load_model
from trainmaster.wallet.budget import Budget

CAPACITIES = ("spot", "on-demand")
OWN_MACHINES = ("local", "ray")
"""Backends on your own machines: never preempted, so no capacity to choose."""
Objective = Literal["cheapest", "fastest", "cheapest-by-deadline"]


@dataclass(frozen=True)
class Step:
    """One backend in a tier, optionally limited to spot or to on-demand capacity."""

    backend: str
    capacity: str | None = None

    def admits_spot(self, spot: bool) -> bool:
        return self.capacity is None or (self.capacity == "spot") == spot

    def __str__(self) -> str:
        return f"{self.backend}:{self.capacity}" if self.capacity else self.backend


def tier_name(tier: tuple[Step, ...]) -> str:
    """A tier as people read it: `aws:spot`, or `{aws:spot, gcp:spot}` for a choice among several."""
    return str(tier[0]) if len(tier) == 1 else "{" + ", ".join(map(str, tier)) + "}"


def parse_step(text: str) -> Step:
    backend, _, capacity = text.partition(":")
    if backend not in KNOWN_BACKENDS:
        close = difflib.get_close_matches(backend, KNOWN_BACKENDS, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else f" (known: {', '.join(KNOWN_BACKENDS)})"
        raise ValueError(f"unknown backend '{backend}'{hint}")
    if capacity and capacity not in CAPACITIES:
        raise ValueError(f"'{text}': after the colon write spot or on-demand")
    if capacity and backend in OWN_MACHINES:
        raise ValueError(f"{backend} has no spot or on-demand capacity to choose; write just '{backend}'")
    return Step(backend, capacity or None)


def _check_step(text: str) -> str:
    parse_step(text)
    return text


def _check_backend(name: str) -> str:
    if ":" in name:
        raise ValueError(f"'{name}': name a backend only; spot or on-demand is chosen in the tiers or by spot_allowed")
    return parse_step(name).backend


def _as_list(value: object) -> object:
    return [value] if isinstance(value, str) else value


StepText = Annotated[str, AfterValidator(_check_step)]
BackendName = Annotated[str, AfterValidator(_check_backend)]
TierText = Annotated[
    list[StepText],
    BeforeValidator(_as_list),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
                    "description": "A step such as aws or aws:spot, or a list of steps chosen among."}),
]
"""A tier: one step, or a list of steps the objective chooses among (held as a list)."""


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Constraints(Model):
    allowed_backends: list[BackendName] | None = Field(
        None, description="Only these backends; default: those named in the primary and fallbacks."
    )
    regions: list[str] | None = Field(
        None, description="Allowed regions as shell patterns (us-*, europe-west4); include 'local' for this machine."
    )
    gpu_types: list[str] | None = Field(None, description="Allowed GPU models (A100, H100, L4 …); default: any.")
    spot_allowed: bool = Field(True, description="Whether preemptible capacity may be used.")
    max_usd_per_hour: Usd | None = Field(None, description="Most a run may cost per hour (all nodes).")
    local_only: bool = Field(False, description="Never leave this machine (private data).")

    def region_allowed(self, region: str) -> bool:
        return self.regions is None or any(fnmatchcase(region, pattern) for pattern in self.regions)


class ClassVerification(Model):
    """How the class's untrusted work is verified (docs/protocol.md §3b, §3c)."""

    tier: Literal["sampled", "replay", "refereed"] | None = Field(
        None, description="The verification tier of this class's jobs whose spec names none: sampled (the default: "
        "replayed segments plus chunks of every boundary), replay (the replayed segments alone) or refereed (two "
        "miners of different coldkeys run the job, a dispute settled by bisection and one replayed segment; "
        "about 2x the compute).")


class ClassPolicy(Model):
    objective: Objective = Field(
        "cheapest", description="cheapest, fastest (earliest expected finish), or cheapest-by-deadline."
    )
    deadline_hours: float | None = Field(
        None, gt=0, description="For cheapest-by-deadline when the job gives no deadline: hours from planning."
    )
    primary: TierText = Field(["local"], description="A step (aws, aws:spot) or a list of steps chosen among.")
    fallbacks: list[TierText] = Field(
        default_factory=list, description="Tiers tried in order when earlier ones have nothing."
    )
    constraints: Constraints = Field(default_factory=Constraints)
    retries: int = Field(
        0, ge=0, le=10, description="Attempts again on the same offer after a crash or preemption, each resuming "
        "from the last committed segment, before the offer is given up for the next one.",
    )
    verification: ClassVerification = Field(default_factory=ClassVerification)
    unreachable_after_s: float = Field(
        600, ge=0, description="How long an attempt may stay unreachable (its backend answering only with "
        "transient errors) before it is taken as lost: tried again on the same offer while `retries` allow, "
        "then on the next offer.",
    )

    @property
    def tiers(self) -> list[tuple[Step, ...]]:
        return [tuple(parse_step(s) for s in tier) for tier in (self.primary, *self.fallbacks)]

    @property
    def chain(self) -> list[str]:
        """Backend names in the order the tiers try them (each once)."""
        return list(dict.fromkeys(step.backend for tier in self.tiers for step in tier))

    @model_validator(mode="after")
    def _consistent(self) -> ClassPolicy:
        steps = [step for tier in self.tiers for step in tier]
        problems = []
        if any(not tier for tier in self.tiers):
            problems.append("a tier is an empty list")
        if len(set(steps)) != len(steps):
            problems.append("a step appears twice in the primary and fallbacks")
        allowed = self.constraints.allowed_backends
        if allowed is not None:
            problems += [f"'{s}' is not in constraints.allowed_backends" for s in steps if s.backend not in allowed]
        if self.constraints.local_only:
            problems += [f"'{s}' leaves this machine but local_only is true" for s in steps if s.backend != "local"]
        if not self.constraints.spot_allowed:
            problems += [f"'{s}' asks for spot but constraints.spot_allowed is false" for s in steps if s.capacity == "spot"]
        if any(s.backend == "local" for s in steps) and not self.constraints.region_allowed("local"):
            problems.append("local is in the chain but constraints.regions excludes 'local'; add it")
        if problems:
            raise ValueError("; ".join(problems))
        return self


class CatalogSettings(Model):
    max_age_days: int = Field(90, ge=1, description="Warn when a price catalog is older than this.")


class OfferSettings(Model):
    valid_s: float = Field(
        600, gt=0, description="How long a quote holds when its backend says nothing shorter; a planned offer "
                               "older than this is quoted again before it is dispatched.")


class TaoRate(Model):
    """The TAO/USD rate TAO-priced offers and charges are valued at: a fixed rate or a source to read."""

    usd_per_tao: Usd | None = Field(None, description="A fixed rate (e.g. $400).")
    source: str | None = Field(None, description='A file or URL holding {"micro_usd_per_tao": N, "at": unix time}; '
                                                 "wins over usd_per_tao.")
    max_age_s: float = Field(3600, gt=0, description="A rate older than this is flagged stale where it is recorded.")


Check = Literal["integrity", "safety", "replay", "outcome"]


class VerificationPolicy(Model):
    """Which checks returned work gets, by whether the compute was ours (local, clouds) or a stranger's."""

    trusted: list[Check] = Field(["integrity", "safety", "outcome"], description="Local and cloud backends.")
    untrusted: list[Check] = Field(
        ["integrity", "safety", "replay", "outcome"], description="Bittensor miners: the replay audit too."
    )
    tau: float | None = Field(None, gt=0, description="Replay tolerance; default: the job class's calibration.")
    challenge_deadline_s: float = Field(
        3600, gt=0, description="How long an executor has to deliver the segments its challenge names; "
                                "an untrusted one that has not by then is rejected.")

    @model_validator(mode="after")
    def _untrusted_keeps_the_essentials(self) -> VerificationPolicy:
        missing = {"integrity", "safety"} - set(self.untrusted)
        if missing:
            raise ValueError(f"untrusted work must always get {' and '.join(sorted(missing))}")
        return self


class Policy(Model):
    name: str
    description: str = ""
    local_only: bool = Field(False, description="Every class stays on this machine (private data).")
    power: PowerModel | None = Field(
        None, description="Prices runs on your own GPUs for the jobs under this policy, over backends.yaml's "
                          "local.power; unset: backends.yaml's (or its default).")
    default: ClassPolicy = Field(default_factory=ClassPolicy, description="For classes not listed in `classes`.")
    classes: dict[Workload, ClassPolicy] = Field(default_factory=dict)
    budgets: list[Budget] = Field(default_factory=list, description="Caps on spend, enforced by the ledger.")
    catalog: CatalogSettings = Field(default_factory=CatalogSettings)
    offers: OfferSettings = Field(default_factory=OfferSettings)
    tao_rate: TaoRate = Field(default_factory=TaoRate)
    verification: VerificationPolicy = Field(default_factory=VerificationPolicy)

    def for_class(self, workload: str) -> ClassPolicy:
        return self.classes.get(workload, self.default)

    @model_validator(mode="before")
    @classmethod
    def _local_only_everywhere(cls, data: object) -> object:
        """A policy-wide `local_only` is every class's, so a class that leaves the machine is reported
        at its own line."""
        if not (isinstance(data, dict) and data.get("local_only") is True):
            return data
        data = dict(data)
        if isinstance(data.get("default"), dict):
            data["default"] = _forced_local(data["default"])
        if isinstance(data.get("classes"), dict):
            data["classes"] = {k: _forced_local(v) if isinstance(v, dict) else v for k, v in data["classes"].items()}
        return data

    @model_validator(mode="after")
    def _unique_budgets(self) -> Policy:
        labels = [b.label for b in self.budgets]
        twice = sorted({n for n in labels if labels.count(n) > 1})
        if twice:
            raise ValueError("; ".join(f"budgets: two budgets are named '{name}'" for name in twice))
        return self


def _forced_local(cls: dict) -> dict:
    constraints = cls.get("constraints")
    constraints = dict(constraints) if isinstance(constraints, dict) else {}
    return {**cls, "constraints": {**constraints, "local_only": True}}


def shipped() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("trainmaster.configs").iterdir() if p.name.endswith(".yaml"))


def names_a_file(name_or_path: str | Path) -> bool:
    """Whether a policy argument is a file's path rather than a policy's name: a Path, anything with a folder
    separator or a `.yaml`/`.yml` suffix, or a bare word naming a regular file in the working directory (a folder
    or a FIFO of that name is no policy file: the name is looked up instead)."""
    text = str(name_or_path)
    return (isinstance(name_or_path, Path) or os.sep in text or "/" in text or text.endswith((".yaml", ".yml"))
            or is_regular_file(text))


_in_force: dict[str, Policy] = {}
"""The user's policies by name as a daemon last validated them (broker/daemon/config_watch.py): while their files
do not validate, these stay in force. Empty outside a daemon (each command reads the files)."""


def keep_in_force(policies: dict[str, Policy]) -> None:
    """Use these user policies by name, over their files (the daemon's last valid set)."""
    global _in_force
    _in_force = dict(policies)


def load_policy(name_or_path: str | Path = "default") -> Policy:
    """A policy by file path (`names_a_file`), or by name from the user config dir, then the shipped ones.
    Files are read bounded (jobs/userfile.py): a FIFO or a device is refused, never read."""
    if names_a_file(name_or_path):
        return load_model(Path(name_or_path), Policy)
    if (kept := _in_force.get(str(name_or_path))) is not None:
        return kept
    user = paths.config_dir() / "policies" / f"{name_or_path}.yaml"
    if user.exists() or user.is_symlink():
        return load_model(user, Policy)
    shipped_file = resources.files("trainmaster.configs") / f"{name_or_path}.yaml"
    if not shipped_file.is_file():
        raise FileError(str(name_or_path), [f"no policy named {name_or_path!r}; shipped: {', '.join(shipped())}"])
    return load_model(Path(str(shipped_file)), Policy, text=shipped_file.read_text())
