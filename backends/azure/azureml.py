"""Azure ML command jobs as the managed backend's training service (azure-ai-ml's MLClient).

A job is named after the attempt, so `start` finds one it started before. The bundle is the job's `bundle`
input (a uri_file the service downloads: AZURE_ML_INPUT_bundle), the synced folder its `sync` output (a
uri_folder mounted read-write: AZURE_ML_OUTPUT_sync); several instances run under a PyTorch distribution (one
process each: the launcher starts torchrun itself). Spot is the job's queue tier. Azure ML reports no billable
time: it is the end minus the start the job's properties carry (`StartTimeUtc`, `EndTimeUtc`); a failure's
text (`Error`) tells capacity and preemption from the script's own failure.
"""

from __future__ import annotations

import datetime
import os
import shlex

from trainmaster.backends.azure import sdk
from trainmaster.backends.azure.config import AzureConfig
from trainmaster.backends.base import BackendError, Cause, Phase
from trainmaster.backends.managed.training_service import ServiceJob, ServiceState, TrainingService

EXPERIMENT = "trainmaster"
PHASES = {
    "NotStarted": Phase.pending, "Starting": Phase.pending, "Provisioning": Phase.pending, "Preparing": Phase.pending,
    "Queued": Phase.pending, "Running": Phase.running, "Finalizing": Phase.running,
    "Completed": Phase.succeeded, "Failed": Phase.failed, "CancelRequested": Phase.cancelled,
    "Canceled": Phase.cancelled,
}
"""Azure ML's job states in their order (its SDK's `Job.status`): `Starting` comes before the compute is
provisioned, so only `Running` and `Finalizing` run; a state not listed (NotResponding, Paused) counts as pending."""
START, END, ERROR = "StartTimeUtc", "EndTimeUtc", "Error"
PREEMPTED_WORDS = ("preempt", "low priority", "lowpriority", "spot", "evict")


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
            name=job.name, display_name=job.name, experiment_name=EXPERIMENT, command=shlex.join(job.command),
            environment=self.config.environment or entities.Environment(image=job.image),
            compute=self.config.compute, instance_count=job.instance_count,
            instance_type=None if self.config.compute else job.instance,
            distribution=ml.PyTorchDistribution(process_count_per_instance=1) if job.instance_count > 1 else None,
            job_tier="Spot" if job.spot else "Standard", timeout=job.max_seconds,
            inputs={"bundle": ml.Input(type="uri_file", path=job.bundle_uri)},
            outputs={"sync": ml.Output(type="uri_folder", path=job.sync_uri, mode="rw_mount")},
            environment_variables=job.env, tags=job.labels,
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
        props = job.properties or {}
        started, ended = _time(props.get(START)), _time(props.get(END))
        billable = max(0.0, ended - started) if phase.done and started is not None and ended is not None else None
        cause, reason = None, None
        if phase is Phase.failed:
            reason = props.get(ERROR) or f"Azure ML job {name} failed"
            cause = _cause(reason)
        elif phase is Phase.cancelled:
            cause, reason = Cause.cancelled, f"Azure ML job {name} {status}"
        return ServiceState(phase=phase, cause=cause, reason=reason, started_at=started,
                            ended_at=ended if phase.done else None, billable_seconds=billable)

    async def stop(self, name: str) -> None:
        if (await self.describe(name)).phase.done:
            return
        poller = await sdk.call(f"cancelling Azure ML job {name}", self.client.jobs.begin_cancel, name)
        await sdk.call(f"cancelling Azure ML job {name}", poller.result)


def _cause(reason: str) -> Cause:
    text = reason.lower()
    if any(word in text.replace(" ", "") for word in sdk.CAPACITY_WORDS):
        return Cause.capacity
    if any(word in text for word in PREEMPTED_WORDS):
        return Cause.preempted
    return Cause.script_failed


def _time(value: str | None) -> float | None:
    """An ISO 8601 time as Unix time; None when absent or unreadable."""
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None
    except ValueError:
        return None
