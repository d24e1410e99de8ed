"""moto's in-process server (S3 and SageMaker) on 127.0.0.1, with SageMaker made closer to AWS, for the AWS tests.

moto 5 marks a training job `Completed` at once, forgets `Environment` and `RetryStrategy`, accepts a duplicate
name and has no StopTrainingJob. The patch below (imported before the server starts, same process) creates jobs
`InProgress/Starting` with no start or end time, keeps what moto drops, refuses a duplicate name
(`ResourceInUse`) and stops a running job (`Stopping`). Nothing advances a job by itself: the test, or the
runner playing SageMaker (tests/clouds/aws_runner.py), sets its state with `set_training_status`. `fail_next`
makes the next calls of an action answer an error (throttling, a 5xx, a capacity refusal). Every request is
first checked against the services' own rules (clouds/rules_aws.py): one SageMaker or S3 would refuse is refused.
"""

from __future__ import annotations

import collections
import logging
import threading
import urllib.request

from moto.core import DEFAULT_ACCOUNT_ID
from moto.core.exceptions import JsonRESTError
from moto.core.responses import ActionResult
from moto.sagemaker.exceptions import ResourceInUseException, ValidationError
from moto.sagemaker.models import sagemaker_backends
from moto.sagemaker.responses import SageMakerResponse
from moto.server import ThreadedMotoServer

from clouds import rules_aws

REGION = "us-east-1"
BUCKET = "tm-test-bucket"
ROLE = "arn:aws:iam::123456789012:role/trainmaster-sagemaker"
ERRORS = {  # code -> HTTP status
    "ThrottlingException": 400,
    "InternalFailure": 500,
    "ResourceLimitExceeded": 400,
    "ServiceUnavailable": 503,
}

_faults: dict[str, collections.deque] = collections.defaultdict(collections.deque)
_lock = threading.Lock()
_original_create = SageMakerResponse.create_training_job
_original_describe = SageMakerResponse.describe_training_job


class _Fault(JsonRESTError):
    def __init__(self, code: str):
        super().__init__(code, f"injected by the test: {code}")
        self.code = ERRORS[code]


def _injected(action: str) -> None:
    with _lock:
        code = _faults[action].popleft() if _faults[action] else None
    if code:
        raise _Fault(code)


def _create(self):
    _injected("CreateTrainingJob")
    name = self._get_param("TrainingJobName")
    if name in self.sagemaker_backend.training_jobs:
        raise ResourceInUseException(message=f"Training job names must be unique within an AWS account and region, "
                                             f"and a training job with this name already exists ({name})")
    result = _original_create(self)
    job = self.sagemaker_backend.training_jobs[name]
    job.environment, job.retry_strategy = self._get_param("Environment"), self._get_param("RetryStrategy")
    job.training_job_status, job.secondary_status = "InProgress", "Starting"
    job.training_start_time = job.training_end_time = job.model_artifacts = None
    return result


def _describe(self):
    _injected("DescribeTrainingJob")
    return _original_describe(self)


def _stop(self):
    _injected("StopTrainingJob")
    name = self._get_param("TrainingJobName")
    job = self.sagemaker_backend.training_jobs.get(name)
    if job is None:
        raise ValidationError(message=f"Requested resource not found: {name}")
    if job.training_job_status != "InProgress":
        raise ValidationError(message=f"The request was rejected because the training job is in status "
                                      f"{job.training_job_status}.")
    job.training_job_status = job.secondary_status = "Stopping"
    return ActionResult({})


SageMakerResponse.create_training_job = _create
SageMakerResponse.describe_training_job = _describe
SageMakerResponse.stop_training_job = _stop
rules_aws.install()  # every SageMaker and S3 request checked against the services' own rules


def training_job(name: str):
    """moto's record of a training job (its attributes are describe()'s keys in snake case)."""
    return sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION].training_jobs[name]


def training_jobs() -> dict:
    return sagemaker_backends[DEFAULT_ACCOUNT_ID][REGION].training_jobs


def set_training_status(name: str, status: str, secondary: str | None = None, failure_reason: str | None = None,
                        **extra) -> None:
    """Set a job's state as SageMaker would; `extra` are describe() keys (BillableTimeInSeconds=42)."""
    job = training_job(name)
    job.training_job_status, job.secondary_status = status, secondary or status
    if failure_reason:
        job.failure_reason = failure_reason
    for key, value in extra.items():
        setattr(job, "".join("_" + c.lower() if c.isupper() else c for c in key).lstrip("_"), value)


def fail_next(action: str, *codes: str) -> None:
    """The next calls of `action` (CreateTrainingJob, DescribeTrainingJob, StopTrainingJob) answer these errors."""
    with _lock:
        _faults[action].extend(codes)


class MotoAws:
    """The server, started once per test session; `reset()` empties it (and the injected faults) between tests."""

    def __init__(self):
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"

    def reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(self.endpoint + "/moto-api/reset", method="POST"), timeout=10)
        with _lock:
            _faults.clear()

    def client(self, service: str):
        """A test's own client (no retries, fake keys)."""
        import boto3
        import botocore.config

        return boto3.client(service, endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id="testing",
                            aws_secret_access_key="testing",
                            config=botocore.config.Config(retries={"total_max_attempts": 1}))

    def stop(self) -> None:
        self.server.stop()
