"""The local backend: this machine's GPUs (or CPU) under torchrun, priced by the power model."""

from trainmaster.backends.local.backend import LocalBackend
from trainmaster.backends.local.config import LocalConfig

__all__ = ["LocalBackend", "LocalConfig"]
