"""Azure ML command jobs as the managed backend's training service (azure-ai-ml's MLClient).

A job is named after the attempt (backends/managed/names.py), so `start` finds one it started before. Its
command is `python3 ${{inputs.trainmaster}}/boot.py`, run as written by Azure ML: the `trainmaster` input is
the attempt's input folder (the boot script, the launch plan, the runtime pack), the `bundle` input the
bundle (both downloaded), the `sync` output the synced folder (mounted read-write). Every path is a datastore
URI (`azureml://datastores/<azure.datastore>/paths/<key>`), the form Azure ML takes for a job's outputs: the
datastore is registered once for the storage container (docs/clouds.md). Several instances run under a PyTorch
distribution (one process each: the launcher starts torchrun itself, from MASTER_ADDR and NODE_RANK).

Spot is the job's queue tier on serverless compute; on a compute cluster (`azure.compute`) the cluster's VM size
and tier are what run, so only that size's offers are made (backends/azure/backend.py). What the job resource
documents (the REST API's JobBase) is its `status` and `systemData`: no start or end time, no error text. So
the run time billed is an upper bound, from its creation (`systemData.createdAt`) to its last change once it
ended (`systemData.lastModifiedAt`), queueing included; a failure's cause comes from the synced folder's exit
record (the job's own exit code and last line) or, without one, from the queue tier: a spot job killed from
outside was preempted, another one lost (backends/managed/backend.py).
"""

from __future__ import annotations

import os

from trainmaster.backends.azure import sdk
from trainmaster.backends.azure.config import AzureConfig
from trainmaster.backends.base import BackendError, Cause, Phase
from trainmaster.backends.managed.service import ServiceJob, ServiceState, TrainingService

EXPERIMENT = "trainmaster"
PHASES = {
    "NotStarted": Phase.pending, "Starting": Phase.pending, "Provisioning": Phase.pending, "Preparing": Phase.pending,
    "Queued": Phase.pending, "Running": Phase.running, "Finalizing": Phase.running,
    "Completed": Phase.succeeded, "Failed": Phase.failed, "CancelRequested": Phase.cancelled,
    "Canceled": Phase.cancelled,
}
"""Azure ML's job states in their order (its SDK's `Job.status`): `Starting` comes before the compute is
provisioned, so only `Running` and `Finalizing` run; a state not listed (NotResponding, Paused) counts as pending."""
BILLING = ("Azure ML reports no run time: from the job's creation (systemData.createdAt) to its last change once "
           "ended (systemData.lastModifiedAt), queueing included (an upper bound)")
COMMAND = "python3 ${{inputs.trainmaster}}/boot.py"
BUNDLE, INPUT, SYNC = "bundle", "trainmaster", "sync"


class AzureMLService(TrainingService):
    def __init__(self, config: AzureConfig):
        self.config = config
        self._client = None

    @property
    def client(self):
        if self._client is None:
            subscription = self.config.subscription_id or os.environ.get("AZURE_SUBSCRIPTION_ID")
            missing = [n for n, v in (("subscription_id (or AZURE_SUBSCRIPTION_ID)", subscription),
                                      ("resource_group", self.config.resource_group),
                                      ("workspace", self.config.workspace)) if not v]
            if missing:
                raise BackendError(f"no Azure ML workspace: set azure.{', azure.'.join(missing)}")
            self._client = sdk.ml().MLClient(sdk.credential(self.config.credential), subscription_id=subscription,
                                             resource_group_name=self.config.resource_group,
                                             workspace_name=self.config.workspace, enable_telemetry=False,
                                             show_progress=False)
        return self._client

    async def start(self, job: ServiceJob) -> None:
        if await self._job(job.name) is not None:
            return
        try:
            await sdk.call(f"creating Azure ML job {job.name}", self.client.jobs.create_or_update, self._command(job))
        except BackendError as exc:
            if getattr(exc.__cause__, "status_code", None) != 409:  # created meanwhile: the same attempt's job
                raise

    def _command(self, job: ServiceJob):
        ml = sdk.ml()
        entities = ml.entities
        return ml.command(
            name=job.name, display_name=job.name, experiment_name=EXPERIMENT, command=COMMAND,
            environment=self.config.environment or entities.Environment(image=job.image),
            compute=self.config.compute, instance_count=job.instance_count,
            instance_type=None if self.config.compute else job.instance,
            distribution=ml.PyTorchDistribution(process_count_per_instance=1) if job.instance_count > 1 else None,
            job_tier=None if self.config.compute else ("Spot" if job.spot else "Standard"), timeout=job.max_seconds,
            inputs={BUNDLE: ml.Input(type="uri_file", path=job.bundle_uri, mode="download"),
                    INPUT: ml.Input(type="uri_folder", path=job.input_uri, mode="download")},
            outputs={SYNC: ml.Output(type="uri_folder", path=job.sync_uri, mode="rw_mount")},
            environment_variables=job.env or None, tags=job.labels,
        )

    async def _job(self, name: str):
        """The job named `name`, None when there is none."""
        try:
            return await sdk.call(f"reading Azure ML job {name}", self.client.jobs.get, name)
        except BackendError as exc:
            if isinstance(exc.__cause__, sdk.errors().ResourceNotFoundError):
                return None
            raise

    async def describe(self, name: str) -> ServiceState:
        job = await self._job(name)
        if job is None:
            return ServiceState(phase=Phase.failed, cause=Cause.lost, reason=f"Azure ML has no job {name}")
        status = getattr(job.status, "value", job.status)
        phase = PHASES.get(status, Phase.pending)
        created = getattr(job.creation_context, "created_at", None)
        changed = getattr(job.creation_context, "last_modified_at", None)
        started = created.timestamp() if created else None
        ended = changed.timestamp() if phase.done and changed else None
        billable = max(0.0, ended - started) if started is not None and ended is not None else None
        cause, reason = None, None
        if phase is Phase.failed:
            reason = f"Azure ML job {name} failed"
        elif phase is Phase.cancelled:
            cause, reason = Cause.cancelled, f"Azure ML job {name} {status}"
        return ServiceState(phase=phase, cause=cause, reason=reason, started_at=started, ended_at=ended,
                            billable_seconds=billable, billing_basis=BILLING)

    async def stop(self, name: str) -> None:
        if (await self.describe(name)).phase.done:
            return
        poller = await sdk.call(f"cancelling Azure ML job {name}", self.client.jobs.begin_cancel, name)
        await sdk.call(f"cancelling Azure ML job {name}", poller.result)
