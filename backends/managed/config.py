"""Settings every managed training backend has, beside its cloud's own (`aws:`, `gcp:`, `azure:` in backends.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainmaster.backends.base import BackendConfig


class ManagedConfig(BackendConfig):
    image: str | None = Field(None, description="The container image jobs run in; default: the service's own "
                                                "PyTorch training image for the region. Any image with Python 3.10.12+ "
                                                "(3.11.4+, 3.12+) and torch 2.0+ runs jobs: trainmaster travels "
                                                "with the job.")
    image_python: str | None = Field(None, pattern=r"^3\.\d{1,2}$",
                                     description="The image's Python (3.11): pydantic-core, which trainmaster's "
                                                 "runtime needs, is shipped built for it. Default: the default "
                                                 "image's, or this interpreter's for an image of your own.")
    image_machine: Literal["x86_64", "aarch64"] = Field("x86_64", description="The image's CPU architecture.")
    runtime_wheels: str | None = Field(None, description="A folder of pydantic-core wheels for an image whose "
                                                         "Python differs from this interpreter's; default: one in "
                                                         "the user cache, filled once by `pip download`.")
    setup: str = Field("", description="Shell commands the container runs (bash -e) before the launcher, from "
                                       "the job's input (setup.sh); nothing is installed by default.")
    max_wait_hours: float = Field(24, gt=0, description="How long a SageMaker managed-spot job may wait for capacity "
                                                       "and restarts in all (MaxWaitTimeInSeconds); Vertex AI and "
                                                       "Azure ML have no such setting for spot jobs.")
    poll_s: float = Field(10.0, gt=0, description="How often a run's state is asked of the service while it is watched.")
