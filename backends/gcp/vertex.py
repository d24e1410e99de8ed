"""The managed backend's training service on Vertex AI: one CustomJob per attempt (aiplatform_v1, the low-level client).

Vertex names jobs by id, so the attempt's job name is the CustomJob's display name, with trainmaster's labels:
`start` lists jobs of that display name first and creates none when one of ours is there. Worker pool 0 is one
replica, pool 1 the other `instance_count - 1`, all on the same machine. `base_output_directory` is the
attempt's folder: Vertex then sets AIP_CHECKPOINT_DIR to its `checkpoints/` (the synced folder, seen through the
/gcs mount) and AIP_MODEL_DIR to its `model/`. The container runs the boot script of the attempt's input folder
through the same mount (`python3 /gcs/<bucket>/…/input/boot.py`). Spot jobs are scheduled SPOT (the API applies
`max_wait_duration` to FLEX_START only, so none is sent).
"""

from __future__ import annotations

import re

from trainmaster.backends.base import BackendError, Cause, ConfigurationError, Phase, TransientBackendError
from trainmaster.backends.catalog.accelerators import vertex_accelerator
from trainmaster.backends.catalog.gpus import canonical_gpu
from trainmaster.backends.gcp import sdk
from trainmaster.backends.gcp.config import GcpConfig
from trainmaster.backends.managed.service import ServiceJob, ServiceState, TrainingService

CHECKPOINTS, MODEL = "checkpoints/", "model/"
"""Where Vertex puts AIP_CHECKPOINT_DIR and AIP_MODEL_DIR under a job's base_output_directory."""
TIMEOUT_S = 60.0

PHASES = {"JOB_STATE_QUEUED": Phase.pending, "JOB_STATE_PENDING": Phase.pending, "JOB_STATE_UPDATING": Phase.pending,
          "JOB_STATE_PAUSED": Phase.pending, "JOB_STATE_UNSPECIFIED": Phase.pending,
          "JOB_STATE_RUNNING": Phase.running, "JOB_STATE_SUCCEEDED": Phase.succeeded,
          "JOB_STATE_PARTIALLY_SUCCEEDED": Phase.succeeded, "JOB_STATE_FAILED": Phase.failed,
          "JOB_STATE_EXPIRED": Phase.failed, "JOB_STATE_CANCELLING": Phase.cancelled,
          "JOB_STATE_CANCELLED": Phase.cancelled}
RESOURCE_EXHAUSTED = 8
"""google.rpc.Code of a job that found no capacity (a stockout, a quota)."""
PREEMPTED = re.compile(r"preempt", re.IGNORECASE)
NO_CAPACITY = re.compile(r"resource_exhausted|stockout|resources? (are|is) (insufficient|exhausted|unavailable)|"
                         r"quota|zone_resource_pool_exhausted", re.IGNORECASE)
REQUEST_RATE = re.compile(r"requests? per minute|rate limit|too many requests", re.IGNORECASE)
"""A 429 that names the API's request rate is throttling; any other 429 at create is the job's quota."""


GCS_MOUNT = "/gcs"
"""Where Vertex AI mounts Cloud Storage in the container (Cloud Storage FUSE): gs://B/K is /gcs/B/K."""


def boot_command(input_uri: str) -> list[str]:
    """The container's command: the boot script of the attempt's input folder, read through the /gcs mount."""
    if not input_uri.startswith("gs://"):
        raise BackendError(f"gcp: the job's input {input_uri} is not a gs:// folder")
    return ["python3", f"{GCS_MOUNT}/{input_uri.removeprefix('gs://').rstrip('/')}/boot.py"]


def label(value: str) -> str:
    """A Vertex label value: lower-case letters, digits, `_` and `-`, at most 63 characters."""
    return re.sub(r"[^a-z0-9_-]", "-", value.lower())[:63]


def accelerator(job: ServiceJob) -> tuple[str, int]:
    """Vertex's accelerator type and count for the job: the offer's `detail.accelerator` (its catalog row's),
    else the catalog's name for its GPU."""
    given = job.detail.get("accelerator")
    if isinstance(given, dict) and given.get("type"):
        return str(given["type"]), int(given.get("count", job.gpu_count))
    try:
        return vertex_accelerator(canonical_gpu(job.gpu_type or ""), None), job.gpu_count
    except ValueError as exc:
        raise BackendError(f"gcp: {exc}") from None


def base_output(job: ServiceJob) -> str:
    """The attempt's folder whose `checkpoints/` is the synced folder and whose `model/` the model output."""
    base = job.sync_uri.removesuffix(CHECKPOINTS)
    if base == job.sync_uri or job.model_uri != base + MODEL:
        raise BackendError(f"gcp: Vertex AI puts checkpoints and the model under <base>/{CHECKPOINTS} and "
                           f"<base>/{MODEL}; the synced folder {job.sync_uri} and model folder {job.model_uri} "
                           "do not fit that")
    return base


def state_of(job) -> ServiceState:
    """Our view of a CustomJob: phase, cause and reason of a stop, run time as the billable time."""
    state = job.state.name
    phase = PHASES.get(state, Phase.pending)
    started = job.start_time.timestamp() if job.start_time else None
    ended = job.end_time.timestamp() if job.end_time else None
    message = job.error.message or None
    cause = None
    if phase is Phase.cancelled:
        cause = Cause.cancelled
    elif phase is Phase.failed:
        cause = failure_cause(state, job.error.code, message or "")
    billable = max(0.0, ended - started) if started is not None and ended is not None else None
    return ServiceState(phase=phase, cause=cause, reason=message if phase is Phase.failed else None,
                        started_at=started, ended_at=ended, billable_seconds=billable)


def failure_cause(state: str, code: int, message: str) -> Cause:
    if PREEMPTED.search(message):
        return Cause.preempted
    if state == "JOB_STATE_EXPIRED" or code == RESOURCE_EXHAUSTED or NO_CAPACITY.search(message):
        return Cause.capacity
    return Cause.script_failed


class VertexService(TrainingService):
    def __init__(self, config: GcpConfig):
        self.config = config
        self._client = self._parent = None
        self._names: dict[str, str] = {}
        """display name -> the CustomJob's resource name, as found."""

    @property
    def client(self):
        if self._client is None:
            v1 = sdk.vertex()
            creds, found = sdk.credentials(self.config)
            endpoint = self.config.api_endpoint or f"{self.config.location}-aiplatform.googleapis.com"
            transport = "rest" if "://" in endpoint else "grpc"
            self._client = v1.JobServiceClient(credentials=creds, transport=transport,
                                               client_options={"api_endpoint": endpoint})
            self._parent = f"projects/{sdk.project(self.config, found)}/locations/{self.config.location}"
        return self._client

    @property
    def parent(self) -> str:
        _ = self.client
        return self._parent

    async def start(self, job: ServiceJob) -> None:
        if await self._find(job.name, job.labels) is not None:
            return
        try:
            created = await sdk.call(f"creating Vertex AI job {job.name}", self._create, job)
        except TransientBackendError as exc:
            if self._quota(exc.__cause__):
                raise ConfigurationError(f"gcp: Vertex AI refused {job.name} for the project's quota: {exc.__cause__} "
                                         "(request a higher quota for the region: docs/clouds.md)") from None
            raise
        self._names[job.name] = created.name

    def _create(self, job: ServiceJob):
        return self.client.create_custom_job(parent=self.parent, custom_job=self._custom_job(job), timeout=TIMEOUT_S)

    @staticmethod
    def _quota(exc: BaseException | None) -> bool:
        """A 429 at create that is the job's quota or a stockout, not the API's request rate."""
        from google.api_core import exceptions as api

        return isinstance(exc, api.TooManyRequests) and not REQUEST_RATE.search(str(exc))

    def _custom_job(self, job: ServiceJob):
        v1 = sdk.vertex()
        machine = v1.MachineSpec(machine_type=job.instance)
        if job.gpu_count:
            kind, count = accelerator(job)
            machine.accelerator_type, machine.accelerator_count = v1.AcceleratorType[kind], count
        container = v1.ContainerSpec(image_uri=job.image, command=boot_command(job.input_uri),
                                     env=[v1.EnvVar(name=k, value=v) for k, v in sorted(job.env.items())])
        pools = [v1.WorkerPoolSpec(replica_count=1, machine_spec=machine, container_spec=container)]
        if job.instance_count > 1:
            pools.append(v1.WorkerPoolSpec(replica_count=job.instance_count - 1, machine_spec=machine,
                                           container_spec=container))
        strategy = v1.Scheduling.Strategy.SPOT if job.spot else v1.Scheduling.Strategy.STANDARD
        scheduling = v1.Scheduling(strategy=strategy)  # max_wait_duration applies to FLEX_START only
        if job.max_seconds:
            scheduling.timeout = f"{job.max_seconds}s"
        spec = v1.CustomJobSpec(worker_pool_specs=pools, scheduling=scheduling,
                                base_output_directory=v1.GcsDestination(output_uri_prefix=base_output(job)))
        if self.config.service_account:
            spec.service_account = self.config.service_account
        return v1.CustomJob(display_name=job.name, job_spec=spec,
                            labels={k: label(v) for k, v in job.labels.items()})

    async def _find(self, name: str, labels: dict[str, str] | None = None):
        """Our CustomJob of that display name (with those labels, when given), None when there is none."""
        def listed():
            found = self.client.list_custom_jobs(request={"parent": self.parent, "filter": f'display_name="{name}"'},
                                                timeout=TIMEOUT_S)
            wanted = {k: label(v) for k, v in (labels or {}).items()}
            return next((j for j in found if j.display_name == name and wanted.items() <= dict(j.labels).items()), None)

        job = await sdk.call(f"listing Vertex AI jobs named {name}", listed)
        if job is not None:
            self._names[name] = job.name
        return job

    async def _get(self, name: str):
        if name not in self._names:
            return await self._find(name)
        return await sdk.call(f"reading Vertex AI job {name}",
                              lambda: self.client.get_custom_job(name=self._names[name], timeout=TIMEOUT_S))

    async def describe(self, name: str) -> ServiceState:
        job = await self._get(name)
        if job is None:
            return ServiceState(phase=Phase.failed, cause=Cause.lost, reason=f"Vertex AI has no job named {name}")
        return state_of(job)

    async def stop(self, name: str) -> None:
        job = await self._get(name)
        if job is None or PHASES.get(job.state.name, Phase.pending).done:
            return
        try:
            await sdk.call(f"cancelling Vertex AI job {name}",
                           lambda: self.client.cancel_custom_job(name=job.name, timeout=TIMEOUT_S))
        except BackendError as exc:
            if not _ended_meanwhile(exc.__cause__):
                raise


def _ended_meanwhile(exc: BaseException | None) -> bool:
    """Vertex's answer to cancelling a job that has just ended: FAILED_PRECONDITION (over REST, a 400 saying so)."""
    from google.api_core import exceptions as api

    if isinstance(exc, api.FailedPrecondition):
        return True
    try:
        return exc.response.json()["error"]["status"] == "FAILED_PRECONDITION"
    except (AttributeError, ValueError, KeyError, TypeError):
        return False
