"""Settings every managed training backend has, beside its cloud's own (`aws:`, `gcp:`, `azure:` in backends.yaml)."""

from __future__ import annotations

from pydantic import Field

from trainmaster.backends.base import BackendConfig

VERSION = "0.1.0"
DEFAULT_SETUP = f"python -m pip install --quiet 'trainmaster=={VERSION}'"


class ManagedConfig(BackendConfig):
    image: str | None = Field(None, description="The container image jobs run in; default: the service's own "
                                                "PyTorch training image for the region.")
    setup: str = Field(DEFAULT_SETUP, description="Shell commands run in the container before the launcher "
                                                  "(installs trainmaster into the image); empty for an image "
                                                  "that has it.")
    max_wait_hours: float = Field(24, gt=0, description="How long a spot job may wait for capacity and "
                                                       "restarts in all (SageMaker MaxWaitTimeInSeconds, Vertex "
                                                       "scheduling.max_wait_duration).")
    poll_s: float = Field(10.0, gt=0, description="How often a run's state is asked of the service while it is watched.")
