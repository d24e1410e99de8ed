"""The Ray backend: a Ray cluster of your own machines as one more trusted place to run, through the Jobs API.

Names are resolved on first use, so reading the registry imports neither the backend nor Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainmaster.backends.ray.backend import RayBackend
    from trainmaster.backends.ray.config import RayConfig

__all__ = ["RayBackend", "RayConfig"]


def __getattr__(name: str):
    if name == "RayBackend":
        from trainmaster.backends.ray.backend import RayBackend

        return RayBackend
    if name == "RayConfig":
        from trainmaster.backends.ray.config import RayConfig

        return RayConfig
    raise AttributeError(name)
