"""The managed backend's training service on SageMaker: one CreateTrainingJob per attempt.

The bundle is the job's `bundle` input channel and the attempt's input folder (the boot script, the launch plan,
the runtime pack) its `trainmaster` channel (File mode: SageMaker copies each to /opt/ml/input/data/<channel>/);
the container's entrypoint is `python3 /opt/ml/input/data/trainmaster/boot.py` (every element well within the
256 characters SageMaker allows). The synced folder is its checkpoint configuration (SageMaker keeps
/opt/ml/checkpoints in sync with the attempt's `sync/` prefix, and restores it when it restarts an interrupted
spot job). With a ContainerEntrypoint the container gets no SM_* variables (they come from the
sagemaker-training toolkit, which a custom entrypoint bypasses): the hosts are read from
/opt/ml/input/config/resourceconfig.json (jobs/services.py). Its states map to ours in `phase_of`; the billable
seconds are its BillableTimeInSeconds (managed spot savings included).
"""

from __future__ import annotations

from trainmaster.backends.aws import sdk
from trainmaster.backends.aws.config import AwsConfig
from trainmaster.backends.base import BackendError, Cause, ConfigurationError, Phase
from trainmaster.backends.managed.service import ServiceJob, ServiceState, TrainingService

CHECKPOINTS = "/opt/ml/checkpoints"
CHANNELS = "/opt/ml/input/data"
BUNDLE_CHANNEL, INPUT_CHANNEL = "bundle", "trainmaster"
STARTING = {"Starting", "Pending", "Downloading", "LaunchingMLInstances", "PreparingTrainingStack",
            "DownloadingTrainingImage"}
PREEMPTING = {"Interrupted", "MaxWaitTimeExceeded"}
NO_CAPACITY = ("CapacityError", "InsufficientCapacity", "InsufficientInstanceCapacity")
INTERNAL = ("InternalServerError",)
NO_LIMIT_S = 5 * 86400
"""SageMaker's own cap on MaxRuntimeInSeconds, used when the run sets none."""


class SageMakerService(TrainingService):
    def __init__(self, config: AwsConfig):
        if not config.sagemaker_role_arn:
            raise ConfigurationError("aws.sagemaker_role_arn is not set in backends.yaml: the execution role "
                                     "SageMaker training jobs run as")
        self.config = config

    @property
    def client(self):
        return sdk.client(self.config, "sagemaker")

    async def start(self, job: ServiceJob) -> None:
        try:
            await sdk.call(f"SageMaker CreateTrainingJob {job.name}", self.client.create_training_job,
                           **self.request(job))
        except BackendError as exc:
            if exc.__cause__ is None or sdk.error_code(exc.__cause__)[0] != "ResourceInUse":
                raise
            await self.describe(job.name)  # started before: it exists (no second job)

    def request(self, job: ServiceJob) -> dict:
        """CreateTrainingJob's arguments for `job`."""
        limit = job.max_seconds or NO_LIMIT_S
        stopping = {"MaxRuntimeInSeconds": limit}
        if job.spot:
            stopping["MaxWaitTimeInSeconds"] = max(limit, int(self.config.max_wait_hours * 3600))
        request = {
            "TrainingJobName": job.name,
            "AlgorithmSpecification": {"TrainingImage": job.image, "TrainingInputMode": "File",
                                       "ContainerEntrypoint": entrypoint()},
            "RoleArn": self.config.sagemaker_role_arn,
            "InputDataConfig": [_channel(BUNDLE_CHANNEL, job.bundle_uri), _channel(INPUT_CHANNEL, job.input_uri)],
            "OutputDataConfig": {"S3OutputPath": job.model_uri},
            "ResourceConfig": {"InstanceType": instance_type(job.instance), "InstanceCount": job.instance_count,
                               "VolumeSizeInGB": self.config.volume_size_gb},
            "StoppingCondition": stopping,
            "EnableManagedSpotTraining": job.spot,
            "CheckpointConfig": {"S3Uri": job.sync_uri, "LocalPath": CHECKPOINTS},
            "RetryStrategy": {"MaximumRetryAttempts": self.config.service_retries},
            "Tags": [{"Key": key, "Value": value} for key, value in sorted(job.labels.items())],
        }
        if job.env:
            request["Environment"] = job.env
        return request

    async def describe(self, name: str) -> ServiceState:
        found = await sdk.call(f"SageMaker DescribeTrainingJob {name}", self.client.describe_training_job,
                               TrainingJobName=name)
        return state_of(found)

    async def stop(self, name: str) -> None:
        try:
            await sdk.call(f"SageMaker StopTrainingJob {name}", self.client.stop_training_job, TrainingJobName=name)
        except BackendError as exc:
            if exc.__cause__ is None or sdk.error_code(exc.__cause__)[0] != "ValidationException":
                raise
            if not (await self.describe(name)).phase.done:  # refused for another reason than having ended
                raise


def entrypoint() -> list[str]:
    """The container's argv: the boot script of the `trainmaster` channel (jobs/launcher_boot.py)."""
    return ["python3", f"{CHANNELS}/{INPUT_CHANNEL}/boot.py"]


def _channel(name: str, uri: str) -> dict:
    """An input channel of the objects under `uri` (a key, or a folder ending in /), copied in before the start."""
    return {"ChannelName": name, "InputMode": "File", "DataSource": {"S3DataSource": {
        "S3DataType": "S3Prefix", "S3Uri": uri, "S3DataDistributionType": "FullyReplicated"}}}


def instance_type(instance: str) -> str:
    """SageMaker's name for a catalog instance (`g5.xlarge` → `ml.g5.xlarge`)."""
    return instance if instance.startswith("ml.") else "ml." + instance


def state_of(found: dict) -> ServiceState:
    """Our state of a DescribeTrainingJob answer."""
    phase, cause, reason = phase_of(found.get("TrainingJobStatus", ""), found.get("SecondaryStatus", ""),
                                    found.get("FailureReason") or "")
    billable = found.get("BillableTimeInSeconds")
    return ServiceState(phase=phase, cause=cause, reason=reason, started_at=_time(found.get("TrainingStartTime")),
                        ended_at=_time(found.get("TrainingEndTime")),
                        billable_seconds=float(billable) if billable is not None else None,
                        billed_at_on_demand=True)  # managed spot bills fewer seconds at the on-demand price


def phase_of(status: str, secondary: str, failure: str) -> tuple[Phase, Cause | None, str | None]:
    """(phase, cause, reason) of a job's TrainingJobStatus, SecondaryStatus and FailureReason."""
    if status == "InProgress":
        if secondary in STARTING:
            return Phase.pending, None, None
        if secondary == "Interrupted":
            return Phase.running, None, "spot capacity interrupted the job: SageMaker restarts it from its checkpoints"
        return Phase.running, None, None
    if status == "Stopping":
        return Phase.running, None, "stopping"
    if status == "Completed":
        return Phase.succeeded, None, None
    if status == "Failed":
        if any(mark in failure for mark in NO_CAPACITY):
            return Phase.failed, Cause.capacity, failure
        if failure.startswith(INTERNAL):
            return Phase.failed, Cause.lost, failure
        return Phase.failed, Cause.script_failed, failure or "the training job failed"
    if status == "Stopped":
        if secondary in PREEMPTING:
            return Phase.failed, Cause.preempted, f"SageMaker stopped the spot job ({secondary})"
        return Phase.cancelled, Cause.cancelled, "stopped"
    raise BackendError(f"SageMaker reports a training job status trainmaster does not know: {status!r}")


def _time(value) -> float | None:
    return value.timestamp() if value is not None else None
