"""The Vertex AI training service (backends/gcp/vertex.py) with the real aiplatform_v1 client against FakeVertex."""

from __future__ import annotations

import asyncio
import datetime

import pytest

from trainmaster.backends.base import BackendError, Cause, ConfigurationError, Phase, TransientBackendError
from trainmaster.backends.gcp.config import GcpConfig
from trainmaster.backends.gcp.vertex import VertexService
from trainmaster.backends.managed.training_service import ServiceJob

pytest_plugins = ["clouds.conftest_gcp"]

BASE = "gs://tm-staging/runs/attempts/A_1/"


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def service(gcp):
    return VertexService(GcpConfig(**gcp.config(gcp.credentials), max_wait_hours=2))


def job(**changes) -> ServiceJob:
    fields = dict(name="tm-a-1", image="img:1", env={"B": "2"}, instance="g2-standard-8", instance_count=1,
                  gpu_type="L4", gpu_count=1, spot=True, max_seconds=3600,
                  bundle_uri="gs://tm-staging/runs/bundles/x.tar", input_uri=BASE + "input/",
                  sync_uri=BASE + "checkpoints/", model_uri=BASE + "model/",
                  labels={"trainmaster-job": "J_1", "trainmaster-attempt": "A_1"})
    return ServiceJob(**{**fields, **changes})


def test_the_custom_job_carries_what_the_attempt_asks(service, gcp):
    run(service.start(job(instance_count=3)))
    (created,) = gcp.vertex.jobs.values()
    assert created.display_name == "tm-a-1"
    assert dict(created.labels) == {"trainmaster-job": "j_1", "trainmaster-attempt": "a_1"}
    spec = created.job_spec
    assert [p.replica_count for p in spec.worker_pool_specs] == [1, 2]
    for pool in spec.worker_pool_specs:
        assert pool.machine_spec.machine_type == "g2-standard-8"
        assert pool.machine_spec.accelerator_type.name == "NVIDIA_L4" and pool.machine_spec.accelerator_count == 1
        assert pool.container_spec.image_uri == "img:1"
        assert list(pool.container_spec.command) == ["python3", "/gcs/tm-staging/runs/attempts/A_1/input/boot.py"]
        assert {e.name: e.value for e in pool.container_spec.env} == {"B": "2"}
    assert spec.scheduling.strategy.name == "SPOT"
    assert not spec.scheduling.max_wait_duration  # the API applies it to FLEX_START only
    assert spec.scheduling.timeout.total_seconds() == 3600
    assert spec.base_output_directory.output_uri_prefix == BASE
    assert created.name.startswith("projects/tm-test/locations/us-central1/customJobs/")


def test_the_accelerator_is_the_offers_catalog_detail(service, gcp):
    accelerator = {"type": "NVIDIA_A100_80GB", "count": 1}
    run(service.start(job(instance="a2-ultragpu-1g", gpu_type="A100", detail={"accelerator": accelerator})))
    (created,) = gcp.vertex.jobs.values()
    assert created.job_spec.worker_pool_specs[0].machine_spec.accelerator_type.name == "NVIDIA_A100_80GB"


def test_on_demand_cpu_single_node(service, gcp):
    run(service.start(job(spot=False, gpu_type=None, gpu_count=0, instance="n1-standard-4", max_seconds=None)))
    (created,) = gcp.vertex.jobs.values()
    (pool,) = created.job_spec.worker_pool_specs
    assert pool.machine_spec.accelerator_count == 0
    assert pool.machine_spec.accelerator_type.name == "ACCELERATOR_TYPE_UNSPECIFIED"
    assert created.job_spec.scheduling.strategy.name == "STANDARD" and not created.job_spec.scheduling.timeout


def test_start_is_idempotent_on_the_display_name(service, gcp):
    run(service.start(job()))
    run(VertexService(service.config).start(job()))  # another process, after a crash
    assert len(gcp.vertex.jobs) == 1 and gcp.vertex.calls("create") == 1
    lists = [q for m, p, q in gcp.vertex.log if m == "GET" and p.endswith("customJobs")]
    assert lists and all("display_name" in q for q in lists)


def test_a_job_of_that_name_without_our_labels_is_not_ours(service, gcp):
    run(service.start(job(labels={"trainmaster-attempt": "other"})))
    run(service.start(job()))
    assert len(gcp.vertex.jobs) == 2


def test_a_layout_vertex_cannot_give_is_refused(service):
    with pytest.raises(BackendError, match="checkpoints"):
        run(service.start(job(sync_uri=BASE + "sync/")))


def at(seconds: int) -> datetime.datetime:
    return datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(seconds=seconds)


@pytest.mark.parametrize("state, error, code, phase, cause", [
    ("JOB_STATE_QUEUED", None, 13, Phase.pending, None),
    ("JOB_STATE_PENDING", None, 13, Phase.pending, None),
    ("JOB_STATE_RUNNING", None, 13, Phase.running, None),
    ("JOB_STATE_SUCCEEDED", None, 13, Phase.succeeded, None),
    ("JOB_STATE_FAILED", "The replica workerpool0-0 exited with a non-zero status of 3.", 13, Phase.failed,
     Cause.script_failed),
    ("JOB_STATE_FAILED", "Job was preempted: the spot VM was reclaimed.", 13, Phase.failed, Cause.preempted),
    ("JOB_STATE_FAILED", "Resources are insufficient in region: us-central1.", 8, Phase.failed, Cause.capacity),
    ("JOB_STATE_FAILED", "The following quota metrics exceed quota limits: custom_model_training_nvidia_l4_gpus",
     3, Phase.failed, Cause.capacity),
    ("JOB_STATE_EXPIRED", None, 13, Phase.failed, Cause.capacity),
    ("JOB_STATE_CANCELLING", None, 13, Phase.cancelled, Cause.cancelled),
    ("JOB_STATE_CANCELLED", None, 13, Phase.cancelled, Cause.cancelled),
])
def test_states_map_to_phases_and_causes(service, gcp, state, error, code, phase, cause):
    run(service.start(job()))
    name = gcp.vertex.by_display_name("tm-a-1").name
    gcp.vertex.set_state(name, "JOB_STATE_RUNNING", started=at(0))
    gcp.vertex.set_state(name, state, error=error, code=code, ended=at(125))
    found = run(service.describe("tm-a-1"))
    assert (found.phase, found.cause) == (phase, cause)
    assert found.reason == (error if phase is Phase.failed else None)
    if state in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"):
        assert found.billable_seconds == 125 and found.started_at == at(0).timestamp()


def test_a_job_the_service_does_not_know_is_lost(service):
    found = run(service.describe("tm-never-started"))
    assert (found.phase, found.cause) == (Phase.failed, Cause.lost)


def test_stop_cancels_a_running_job_and_leaves_an_ended_one(service, gcp):
    run(service.start(job()))
    name = gcp.vertex.by_display_name("tm-a-1").name
    gcp.vertex.set_state(name, "JOB_STATE_RUNNING")
    run(service.stop("tm-a-1"))
    assert gcp.vertex.jobs[name].state.name == "JOB_STATE_CANCELLING" and gcp.vertex.calls("cancel") == 1
    gcp.vertex.set_state(name, "JOB_STATE_CANCELLED")
    run(service.stop("tm-a-1"))
    assert gcp.vertex.calls("cancel") == 1


def test_quota_at_create_is_the_set_ups(service, gcp):
    """A quota of the project (a new one has no GPU quota) is a configuration failure: the broker stops trying gcp
    for the job rather than going through its offers one by one."""
    gcp.vertex.fail_next("create", 429, "RESOURCE_EXHAUSTED",
                         "The following quota metrics exceed quota limits: "
                         "aiplatform.googleapis.com/custom_model_training_nvidia_l4_gpus")
    with pytest.raises(ConfigurationError, match="quota"):
        run(service.start(job()))
    assert not gcp.vertex.jobs


@pytest.mark.parametrize("operation, code, status, message", [
    ("create", 429, "RESOURCE_EXHAUSTED", "Quota exceeded for aiplatform.googleapis.com/resource_management_requests "
                                          "per minute per region"),
    ("create", 503, "UNAVAILABLE", "The service is currently unavailable."),
    ("list", 500, "INTERNAL", "Internal error encountered."),
])
def test_throttling_and_5xx_are_transient(service, gcp, operation, code, status, message):
    gcp.vertex.fail_next(operation, code, status, message)
    with pytest.raises(TransientBackendError):
        run(service.start(job()))
    run(service.start(job()))  # the retry succeeds
    assert len(gcp.vertex.jobs) == 1


def test_permission_denied_names_it(service, gcp):
    gcp.vertex.fail_next("list", 403, "PERMISSION_DENIED", "Permission 'aiplatform.customJobs.list' denied")
    with pytest.raises(ConfigurationError, match="permission denied.*aiplatform.customJobs.list"):
        run(service.start(job()))


def test_a_job_that_ends_while_being_cancelled_is_left_as_it_is(service, gcp):
    run(service.start(job()))
    gcp.vertex.set_state(gcp.vertex.by_display_name("tm-a-1").name, "JOB_STATE_RUNNING")
    gcp.vertex.fail_next("cancel", 400, "FAILED_PRECONDITION", "the job is already in state JOB_STATE_SUCCEEDED")
    run(service.stop("tm-a-1"))
    assert gcp.vertex.calls("cancel") == 1


@pytest.mark.parametrize("change, rule", [
    ({"name": "x" * 129}, "display_name of 129 characters"),
    ({"env": {"NOT-A-NAME": "1"}}, "not a C identifier"),
    ({"labels": {"trainmaster-job": "J_1", "Trainmaster": "x"}}, "label key"),
])
def test_the_fake_refuses_what_vertex_refuses(service, gcp, change, rule):
    """FakeVertex reads every CustomJob back strictly through the aiplatform_v1 protos and holds it to the limits
    the API documents: what Vertex AI would refuse is refused, never created."""
    from clouds import checked

    with checked.expected() as refused:
        with pytest.raises(BackendError, match="INVALID_ARGUMENT|400"):
            run(service.start(job(**change)))
    assert refused and rule in refused[0], refused
    assert not gcp.vertex.jobs


def test_max_wait_with_spot_is_refused_by_the_fake(gcp):
    """What the backend sent before: max_wait_duration with SPOT, which the API applies to FLEX_START only."""
    from google.cloud import aiplatform_v1 as v1

    from clouds import rules_vertex

    pool = v1.WorkerPoolSpec(replica_count=1, machine_spec=v1.MachineSpec(machine_type="n1-standard-4"),
                             container_spec=v1.ContainerSpec(image_uri="img:1"))
    job_ = v1.CustomJob(display_name="j", job_spec=v1.CustomJobSpec(worker_pool_specs=[pool], scheduling=v1.Scheduling(
        strategy=v1.Scheduling.Strategy.SPOT, max_wait_duration="3600s")))
    _, found = rules_vertex.custom_job(v1.CustomJob.to_json(job_))
    assert found and "FLEX_START" in found[0]
