"""Cost policies: per workload class, where runs may go and how the planner chooses among offers.

The shipped policies live in `configs/` (package data); a name is looked up in the user config
dir first, then there. `default` is the embedded default: local only.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from trainmaster.backends.power import PowerModel
from trainmaster.broker import paths
from trainmaster.jobs.spec import Usd, Workload
from trainmaster.jobs.yamlfile import FileError, load_model


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Constraints(Model):
    allowed_backends: list[str] | None = Field(None, description="Only these backends; default: those named in the class.")
    max_usd_per_hour: Usd | None = None


class ClassPolicy(Model):
    objective: Literal["cheapest", "fastest"] = "cheapest"
    primary: str = "local"
    fallbacks: list[str] = Field(default_factory=list)
    constraints: Constraints = Field(default_factory=Constraints)

    @property
    def chain(self) -> list[str]:
        return [self.primary, *self.fallbacks]


class Policy(Model):
    name: str
    description: str = ""
    power: PowerModel = Field(default_factory=PowerModel)
    default: ClassPolicy = Field(default_factory=ClassPolicy, description="For classes not listed in `classes`.")
    classes: dict[Workload, ClassPolicy] = Field(default_factory=dict)

    def for_class(self, workload: str) -> ClassPolicy:
        return self.classes.get(workload, self.default)


def shipped() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("trainmaster.configs").iterdir() if p.name.endswith(".yaml"))


def load_policy(name_or_path: str | Path = "default") -> Policy:
    """A policy by file path, or by name from the user config dir, then the shipped ones."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        return load_model(candidate, Policy)
    user = paths.config_dir() / "policies" / f"{name_or_path}.yaml"
    if user.exists():
        return load_model(user, Policy)
    shipped_file = resources.files("trainmaster.configs") / f"{name_or_path}.yaml"
    if not shipped_file.is_file():
        raise FileError(str(name_or_path), [f"no policy named {name_or_path!r}; shipped: {', '.join(shipped())}"])
    return load_model(Path(str(shipped_file)), Policy, text=shipped_file.read_text())
