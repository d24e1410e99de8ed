"""`backends.yaml`: every backend's settings, one section per backend name (`local:`, `aws:` …).

The caller passes the config dir (backends do not know where the broker keeps its files; the
broker and the CLI pass `paths.config_dir()`). A missing or empty file, and a missing or empty
section, mean that backend's defaults. Each section is validated by its backend's config model
(unknown keys are errors), and errors name file, line and field as a job spec's do:
`backends.yaml:3: aws.regoin: unknown field; did you mean 'region'?`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model

from trainmaster.backends.base import BackendConfig
from trainmaster.backends.registry import REGISTRY
from trainmaster.jobs.yamlfile import FileError, load_model

FILE_NAME = "backends.yaml"


def config_file(config_dir: Path) -> Path:
    return Path(config_dir) / FILE_NAME


def load_configs(config_dir: Path) -> dict[str, BackendConfig]:
    """Each registered backend's config (defaults where the file says nothing); FileError when invalid."""
    path = config_file(config_dir)
    try:
        loaded = load_model(path, file_model()) if path.exists() else file_model()()
    except FileError as exc:
        if exc.problems != [f"{path}:1: the file is empty"]:
            raise
        loaded = file_model()()  # every line commented out
    return {name: getattr(loaded, name) for name in REGISTRY}


DEFAULT, FILE = "default", FILE_NAME


@dataclass(frozen=True)
class Effective:
    """A backend's configuration as used, and where each field's value came from."""

    config: BackendConfig
    sources: dict[str, str]
    """Field -> "default", "backends.yaml", "broker default" or "policy NAME"."""


def effective(config: BackendConfig, *, policy: str | None = None, policy_values: Mapping[str, Any] | None = None,
              broker_defaults: Mapping[str, Any] | None = None) -> Effective:
    """`config` (a backends.yaml section) with the broker's defaults filling fields the file leaves unset
    and the policy's values laid over the fields the config model declares `overridable`."""
    model = type(config)
    sources = {f: FILE if f in config.model_fields_set else DEFAULT for f in model.model_fields}
    update: dict[str, Any] = {}
    for field, value in (broker_defaults or {}).items():
        if sources.get(field) == DEFAULT and getattr(config, field) is None:
            update[field], sources[field] = value, "broker default"
    for field, value in (policy_values or {}).items():
        if field in model.overridable and value is not None:
            update[field], sources[field] = value, f"policy {policy}"
    return Effective(config.model_copy(update=update) if update else config, sources)


def _none_is_empty(value: object) -> object:
    """`aws:` with every key commented out is an empty section, not an error."""
    return {} if value is None else value


@lru_cache(maxsize=1)
def file_model() -> type[BaseModel]:
    """The whole file as one model: an optional section per registered backend, nothing else."""
    sections = {
        name: (Annotated[entry.config_model(), BeforeValidator(_none_is_empty)],
               Field(default_factory=entry.config_model(), description=f"Settings of the {name} backend."))
        for name, entry in REGISTRY.items()
    }
    return create_model("BackendsFile", __config__=ConfigDict(extra="forbid", frozen=True), **sections)
