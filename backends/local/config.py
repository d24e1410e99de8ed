"""The local backend's settings (`local:` in backends.yaml): what your own power costs, where job
virtualenvs are cached."""

from __future__ import annotations

from pydantic import Field

from trainmaster.backends.base import BackendConfig
from trainmaster.backends.power import PowerModel


class LocalConfig(BackendConfig):
    power: PowerModel = Field(default_factory=PowerModel, description="Prices runs on this machine.")
    envs_dir: str | None = Field(None, description="Where `environment: requirements` virtualenvs are cached.")
