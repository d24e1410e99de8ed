"""The SageMaker training service (backends/aws/sagemaker.py) with the real boto3 client against moto on 127.0.0.1:
the job as CreateTrainingJob received it, an idempotent start, the state table, stop, and SageMaker's errors as
the core's typed errors."""

from __future__ import annotations

import asyncio
import datetime

import pytest

from clouds import checked
from clouds.aws_server import ROLE, fail_next, set_training_status, training_job, training_jobs
from trainmaster.backends.aws.config import AwsConfig
from trainmaster.backends.aws.sagemaker import SageMakerService, phase_of
from trainmaster.backends.base import BackendError, Cause, ConfigurationError, Phase, TransientBackendError
from trainmaster.backends.managed.training_service import ServiceJob

pytest_plugins = ["clouds.conftest_aws"]


def run(coro):
    return asyncio.run(coro)


def job(**kw) -> ServiceJob:
    fields = dict(name="tm-att-1", image="img:1", env={"PYTHONUNBUFFERED": "1"}, instance="g5.xlarge",
                  instance_count=2, gpu_type="A10G", gpu_count=1, spot=True, max_seconds=3600,
                  bundle_uri="s3://b/p/bundles/x.tar", input_uri="s3://b/p/attempts/att-1/input/",
                  sync_uri="s3://b/p/attempts/att-1/sync/", model_uri="s3://b/p/attempts/att-1/model/",
                  labels={"trainmaster-job": "job1", "trainmaster-attempt": "att-1"})
    return ServiceJob(**{**fields, **kw})


@pytest.fixture
def service(aws_config):
    return SageMakerService(aws_config.model_copy(update={"max_wait_hours": 2}))


def test_the_job_is_created_with_the_fields_sagemaker_needs(service, aws):
    run(service.start(job()))
    found = aws.client("sagemaker").describe_training_job(TrainingJobName="tm-att-1")
    assert found["AlgorithmSpecification"]["TrainingImage"] == "img:1"
    assert found["AlgorithmSpecification"]["TrainingInputMode"] == "File"
    assert found["AlgorithmSpecification"]["ContainerEntrypoint"] == ["python3",
                                                                       "/opt/ml/input/data/trainmaster/boot.py"]
    assert found["RoleArn"] == ROLE
    assert found["InputDataConfig"] == [
        {"ChannelName": "bundle", "InputMode": "File", "DataSource": {"S3DataSource": {
            "S3DataType": "S3Prefix", "S3Uri": "s3://b/p/bundles/x.tar", "S3DataDistributionType": "FullyReplicated"}}},
        {"ChannelName": "trainmaster", "InputMode": "File", "DataSource": {"S3DataSource": {
            "S3DataType": "S3Prefix", "S3Uri": "s3://b/p/attempts/att-1/input/",
            "S3DataDistributionType": "FullyReplicated"}}}]
    assert found["OutputDataConfig"] == {"S3OutputPath": "s3://b/p/attempts/att-1/model/"}
    assert found["ResourceConfig"] == {"InstanceType": "ml.g5.xlarge", "InstanceCount": 2, "VolumeSizeInGB": 50}
    assert found["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200}
    assert found["EnableManagedSpotTraining"] is True
    assert found["CheckpointConfig"] == {"S3Uri": "s3://b/p/attempts/att-1/sync/", "LocalPath": "/opt/ml/checkpoints"}
    assert found["TrainingJobStatus"] == "InProgress" and found["SecondaryStatus"] == "Starting"
    recorded = training_job("tm-att-1")  # what describe() does not echo back, as the SDK sent it
    assert recorded.environment == {"PYTHONUNBUFFERED": "1"}
    assert recorded.retry_strategy == {"MaximumRetryAttempts": 1}
    assert sorted((t["Key"], t["Value"]) for t in recorded.tags) == [("trainmaster-attempt", "att-1"),
                                                                     ("trainmaster-job", "job1")]


def test_on_demand_has_no_max_wait(service, aws):
    run(service.start(job(spot=False, max_seconds=None, instance="ml.m5.xlarge", instance_count=1)))
    found = aws.client("sagemaker").describe_training_job(TrainingJobName="tm-att-1")
    assert found["EnableManagedSpotTraining"] is False
    assert found["StoppingCondition"] == {"MaxRuntimeInSeconds": 5 * 86400}
    assert found["ResourceConfig"]["InstanceType"] == "ml.m5.xlarge"


def test_start_is_idempotent_on_the_name(service):
    run(service.start(job()))
    run(service.start(job(image="img:2")))
    assert list(training_jobs()) == ["tm-att-1"]
    assert training_job("tm-att-1").algorithm_specification["TrainingImage"] == "img:1"


def test_describe_follows_the_job(service):
    run(service.start(job()))
    assert run(service.describe("tm-att-1")).phase is Phase.pending
    began = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    set_training_status("tm-att-1", "InProgress", "Training", TrainingStartTime=began)
    state = run(service.describe("tm-att-1"))
    assert state.phase is Phase.running and state.started_at == began.timestamp()
    set_training_status("tm-att-1", "Completed", BillableTimeInSeconds=42,
                        TrainingEndTime=began + datetime.timedelta(seconds=100))
    state = run(service.describe("tm-att-1"))
    assert (state.phase, state.billable_seconds, state.ended_at) == (Phase.succeeded, 42.0, began.timestamp() + 100)


@pytest.mark.parametrize("status, secondary, failure, expected", [
    ("InProgress", "Starting", "", (Phase.pending, None)),
    ("InProgress", "Downloading", "", (Phase.pending, None)),
    ("InProgress", "Training", "", (Phase.running, None)),
    ("InProgress", "Interrupted", "", (Phase.running, None)),
    ("Stopping", "Stopping", "", (Phase.running, None)),
    ("Completed", "Completed", "", (Phase.succeeded, None)),
    ("Failed", "Failed", "AlgorithmError: exit code 3", (Phase.failed, Cause.script_failed)),
    ("Failed", "Failed", "CapacityError: Unable to provision requested ML compute capacity.", (Phase.failed, Cause.capacity)),
    ("Failed", "Failed", "InternalServerError: We encountered an internal error.", (Phase.failed, Cause.lost)),
    ("Stopped", "Stopped", "", (Phase.cancelled, Cause.cancelled)),
    ("Stopped", "Interrupted", "", (Phase.failed, Cause.preempted)),
    ("Stopped", "MaxWaitTimeExceeded", "", (Phase.failed, Cause.preempted)),
])
def test_state_table(status, secondary, failure, expected):
    phase, cause, reason = phase_of(status, secondary, failure)
    assert (phase, cause) == expected
    if failure:
        assert reason == failure


def test_an_unknown_status_is_an_error():
    with pytest.raises(BackendError, match="'Paused'"):
        phase_of("Paused", "", "")


def test_stop_stops_a_running_job_and_leaves_an_ended_one(service):
    run(service.start(job()))
    set_training_status("tm-att-1", "InProgress", "Training")
    run(service.stop("tm-att-1"))
    assert training_job("tm-att-1").training_job_status == "Stopping"
    set_training_status("tm-att-1", "Completed")
    run(service.stop("tm-att-1"))  # ended: left as it is, no error
    assert training_job("tm-att-1").training_job_status == "Completed"
    with pytest.raises(BackendError, match="tm-never"):
        run(service.stop("tm-never"))


@pytest.mark.parametrize("code, error", [("ThrottlingException", TransientBackendError),
                                         ("InternalFailure", TransientBackendError),
                                         ("ResourceLimitExceeded", ConfigurationError)])
def test_service_errors_are_typed(service, code, error):
    fail_next("CreateTrainingJob", code)
    with pytest.raises(error, match=code):
        run(service.start(job()))
    run(service.start(job()))  # the fault passed: the next call goes through
    assert list(training_jobs()) == ["tm-att-1"]


def test_no_execution_role_is_named():
    with pytest.raises(BackendError, match="aws.sagemaker_role_arn is not set"):
        SageMakerService(AwsConfig())


@pytest.mark.parametrize("change, rule", [
    ({"name": "tm-job.1"}, "TrainingJobName"),  # a dot: SageMaker's names are letters, digits and inner hyphens
    ({"name": "tm-" + "x" * 61}, "TrainingJobName"),  # 64 characters
    ({"env": {"TRAINMASTER_LAUNCH": "x" * 513}}, "Environment"),  # a value over 512 characters
    ({"env": {"NOT-A-NAME": "1"}}, "Environment"),
    ({"image": "i" * 256}, "TrainingImage"),
])
def test_the_fake_refuses_what_sagemaker_refuses(service, change, rule):
    """moto checks every request against botocore's own model (max, pattern, enum: what the service enforces and
    botocore's client-side validator skips): what SageMaker would refuse is refused, never created."""
    with checked.expected() as refused:
        with pytest.raises(BackendError, match="ValidationException"):
            run(service.start(job(**change)))
    assert refused and rule in refused[0], refused
    assert training_jobs() == {}


def test_what_the_backend_sends_keeps_every_rule(service):
    start = checked.mark()
    run(service.start(job()))
    assert checked.since(start) == [] and list(training_jobs()) == ["tm-att-1"]


@pytest.mark.parametrize("code, message, status", [
    ("ValidationException", "Could not assume role arn:aws:iam::123456789012:role/r. Please ensure that the role "
                            "exists and allows principal 'sagemaker.amazonaws.com' to assume the role.", 400),
    ("AccessDeniedException", "User: arn:aws:iam::123456789012:user/u is not authorized to perform: iam:PassRole", 400),
    ("ResourceLimitExceeded", "The account-level service limit 'ml.g5.xlarge for spot training job usage' is 0 "
                              "Instances, with current utilization of 0 Instances and a request delta of 1 Instances.", 400),
    ("NoSuchBucket", "The specified bucket does not exist", 404),
])
def test_what_the_set_up_refuses_is_a_configuration_error(code, message, status):
    """A role SageMaker cannot assume, a PassRole the credentials lack, a quota of 0, a bucket that is not there:
    SageMaker's own words, typed so the broker drops aws for the job after this one attempt."""
    from botocore.exceptions import ClientError

    from trainmaster.backends.aws import sdk

    error = ClientError({"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}},
                        "CreateTrainingJob")
    typed = sdk.typed_error("SageMaker CreateTrainingJob tm-x", error)
    assert type(typed) is ConfigurationError and message in str(typed)
    plain = ClientError({"Error": {"Code": "ValidationException", "Message": "1 validation error detected"},
                         "ResponseMetadata": {"HTTPStatusCode": 400}}, "CreateTrainingJob")
    assert type(sdk.typed_error("x", plain)) is BackendError
