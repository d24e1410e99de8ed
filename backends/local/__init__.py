"""The local backend: this machine's GPUs (or CPU) under torchrun, priced by the power model.

Names are resolved on first use, so the job's supervisor (`python -m trainmaster.backends.local.supervisor`,
started for every attempt) does not pay for importing the backend, pydantic and the job spec first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainmaster.backends.local.backend import LocalBackend
    from trainmaster.backends.local.config import LocalConfig

__all__ = ["LocalBackend", "LocalConfig"]


def __getattr__(name: str):
    if name == "LocalBackend":
        from trainmaster.backends.local.backend import LocalBackend

        return LocalBackend
    if name == "LocalConfig":
        from trainmaster.backends.local.config import LocalConfig

        return LocalConfig
    raise AttributeError(name)
