"""A managed training service as the managed backends use it: start a container job, describe it, stop it.

Each cloud implements it over its SDK (`backends/aws/sagemaker.py`, `backends/gcp/vertex.py`,
`backends/azure/azureml.py`). `start` is idempotent on the job's name (derived from the attempt id): started
again after a crash it finds the job it started. `describe` maps the service's states to ours, with the
cause of a stop (preempted, capacity, lost, the script failed) and the billable time as the service reports
it. Capacity refusals raise `CapacityError`, throttling and 5xx `TransientBackendError`.
"""

from __future__ import annotations

import abc
from typing import Any

from pydantic import Field

from trainmaster.backends.base import Cause, Frozen, Phase


class ServiceJob(Frozen):
    """One container job, as the backend asks the service for it. The container runs the boot script of the
    job's input folder (`input_uri`: boot.py, launch.json, runtime.zip; jobs/launcher_boot.py), which each
    service names by where it puts that folder (SageMaker's `trainmaster` channel, Vertex AI's /gcs mount,
    Azure ML's `trainmaster` input)."""

    name: str = Field(description="The service's job name: derived from the attempt id, so a second start finds it.")
    image: str
    env: dict[str, str] = Field(default_factory=dict, description="Variables of the container beyond the "
                                                                   "service's own (the plan is a file, not one).")
    instance: str = Field(description="The service's instance type (`ml.g5.xlarge`, `n1-standard-8`, a VM size).")
    instance_count: int = Field(1, ge=1)
    gpu_type: str | None = None
    gpu_count: int = 0
    spot: bool = False
    detail: dict[str, Any] = Field(default_factory=dict, description="The offer's detail as its catalog row gave it "
                                                                      "(Vertex: the accelerator beside the machine type).")
    max_seconds: int | None = Field(None, ge=1, description="The run's time limit (limits.max_hours, the cost cap).")
    bundle_uri: str = Field(description="The bundle in the object store (what the service mounts or copies in).")
    input_uri: str = Field(description="The attempt's input folder in the object store (ends with /).")
    sync_uri: str = Field(description="The attempt's synced folder in the object store.")
    model_uri: str = Field(description="Where the service keeps its own copy of the model (its output path).")
    labels: dict[str, str] = Field(default_factory=dict, description="trainmaster's job and attempt ids, as tags.")


class ServiceState(Frozen):
    phase: Phase
    cause: Cause | None = None
    reason: str | None = None
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    billable_seconds: float | None = Field(None, ge=0, description="Per instance, as the service bills it "
                                                                   "(SageMaker's BillableTimeInSeconds: spot savings "
                                                                   "included); None when it reports none.")
    billing_basis: str | None = Field(None, description="Where the billable seconds come from, when the service does "
                                                         "not report them itself (said in the cost's basis).")
    billed_at_on_demand: bool = Field(False, description="The billable seconds already carry the spot saving and are "
                                                         "billed at the on-demand price (SageMaker managed spot), so "
                                                         "a spot offer is charged at its row's on-demand price.")


class TrainingService(abc.ABC):
    @abc.abstractmethod
    async def start(self, job: ServiceJob) -> None:
        """Create the job; a job of that name already there is the one started before (no second one)."""

    @abc.abstractmethod
    async def describe(self, name: str) -> ServiceState: ...

    @abc.abstractmethod
    async def stop(self, name: str) -> None:
        """Ask the service to stop the job; a job already ended is left as it is."""
