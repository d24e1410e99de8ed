"""The Azure ML training service against the strict fake, through the real MLClient: the job as the SDK sends it
(spot tier, instances, distribution, the bundle input, the synced output, limits), an idempotent start, the
state table with causes and billable time, stop, and typed errors (throttling, capacity, a missing workspace)."""

from __future__ import annotations

import asyncio
import json

import pytest

from trainmaster.backends.azure.azureml import AzureMLService
from trainmaster.backends.base import BackendError, CapacityError, Cause, Phase, TransientBackendError
from trainmaster.backends.managed.training_service import ServiceJob

pytest_plugins = ["clouds.conftest_azure"]


def run(coro):
    return asyncio.run(coro)


def job(**changes) -> ServiceJob:
    fields = dict(name="tm-a1", image="img:1", command=["python", "-m", "trainmaster.jobs.launcher"],
                  env={"TRAINMASTER_LAUNCH": "{}"}, instance="Standard_NC4as_T4_v3", instance_count=2, spot=True,
                  max_seconds=600, bundle_uri="http://127.0.0.1:1/acct/c/bundles/b.tar",
                  sync_uri="http://127.0.0.1:1/acct/c/attempts/a1/sync/", model_uri="http://127.0.0.1:1/acct/c/m/",
                  labels={"trainmaster-job": "j1", "trainmaster-attempt": "a1"})
    return ServiceJob(**{**fields, **changes})


def puts(azure, name="tm-a1"):
    return [json.loads(body) for method, path, body in azure.fake.log if method == "PUT" and path.endswith(f"/jobs/{name}")]


def test_the_job_as_the_sdk_sent_it(azure, azure_config):
    run(AzureMLService(azure_config).start(job()))
    [sent] = puts(azure)
    props = sent["properties"]
    assert props["jobType"] == "Command" and props["command"] == "python -m trainmaster.jobs.launcher"
    assert props["queueSettings"] == {"jobTier": "Spot"}
    assert props["resources"]["instanceCount"] == 2 and props["resources"]["instanceType"] == "Standard_NC4as_T4_v3"
    assert props["distribution"] == {"processCountPerInstance": 1, "distributionType": "PyTorch"}
    assert props["inputs"] == {"bundle": {"uri": "http://127.0.0.1:1/acct/c/bundles/b.tar", "jobInputType": "uri_file"}}
    assert props["outputs"] == {"sync": {"uri": "http://127.0.0.1:1/acct/c/attempts/a1/sync/", "mode": "ReadWriteMount",
                                         "jobOutputType": "uri_folder"}}
    assert props["limits"] == {"timeout": "PT10M", "jobLimitsType": "Command"}
    assert props["environmentVariables"] == {"TRAINMASTER_LAUNCH": "{}"}
    assert props["tags"] == {"trainmaster-job": "j1", "trainmaster-attempt": "a1"}
    assert props["environmentId"].endswith("/environments/CliV2AnonymousEnvironment/versions/"
                                           + props["environmentId"].rsplit("/", 1)[1])
    assert "computeId" not in props  # serverless: the offer's VM size


def test_one_node_on_demand_on_a_cluster_with_a_named_environment(azure, azure_config):
    config = azure_config.model_copy(update={"compute": "gpu-cluster", "environment": "azureml:torch-env:3"})
    run(AzureMLService(config).start(job(instance_count=1, spot=False, max_seconds=None)))
    props = puts(azure)[0]["properties"]
    assert props["queueSettings"] == {"jobTier": "Standard"}
    assert props["computeId"].endswith("/computes/gpu-cluster") and "instanceType" not in props["resources"]
    assert props["environmentId"].endswith("/environments/torch-env/versions/3")
    assert "distribution" not in props and "limits" not in props
    assert not any("/environments/" in path for method, path, _ in azure.fake.log if method == "PUT")


def test_start_is_idempotent_on_the_name(azure, azure_config):
    service = AzureMLService(azure_config)
    run(service.start(job()))
    run(service.start(job()))  # found by name: no second job
    assert len(puts(azure)) == 1
    azure.fake.jobs.clear()
    azure.fake.faults.append(("GET", 404, "UserError", "job not found"))  # not there when asked, created meanwhile
    azure.fake.faults.append(("PUT", 409, "Conflict", "job tm-a1 already exists"))
    run(service.start(job()))
    assert len(puts(azure)) == 2


@pytest.mark.parametrize("status,error,phase,cause", [
    ("NotStarted", None, Phase.pending, None), ("Queued", None, Phase.pending, None),
    ("Preparing", None, Phase.pending, None), ("Provisioning", None, Phase.pending, None),
    ("Starting", None, Phase.pending, None), ("Running", None, Phase.running, None),
    ("Finalizing", None, Phase.running, None), ("Completed", None, Phase.succeeded, None),
    ("Failed", "InsufficientCapacity: no Standard_NC4as_T4_v3 in eastus", Phase.failed, Cause.capacity),
    ("Failed", "Quota exceeded for family NCASv3_T4", Phase.failed, Cause.capacity),
    ("Failed", "The low priority node was preempted", Phase.failed, Cause.preempted),
    ("Failed", "UserError: the script exited with 3", Phase.failed, Cause.script_failed),
    ("CancelRequested", None, Phase.cancelled, Cause.cancelled), ("Canceled", None, Phase.cancelled, Cause.cancelled),
])
def test_states_map_to_phases_and_causes(azure, azure_config, status, error, phase, cause):
    service = AzureMLService(azure_config)
    run(service.start(job()))
    azure.fake.set_status("tm-a1", status, error=error, start=1000.0, end=1042.5)
    state = run(service.describe("tm-a1"))
    assert (state.phase, state.cause) == (phase, cause)
    assert state.started_at == 1000.0
    assert state.billable_seconds == (42.5 if phase.done else None)
    if error:
        assert state.reason == error


def test_a_job_the_service_lost_and_stop(azure, azure_config):
    service = AzureMLService(azure_config)
    assert run(service.describe("tm-gone")).cause is Cause.lost
    run(service.start(job()))
    azure.fake.set_status("tm-a1", "Running")
    run(service.stop("tm-a1"))
    assert azure.fake.properties("tm-a1")["status"] == "CancelRequested"
    azure.fake.set_status("tm-a1", "Completed")
    azure.fake.log.clear()
    run(service.stop("tm-a1"))  # ended already: left as it is
    assert not any(path.endswith("/cancel") for _, path, _ in azure.fake.log)


def test_errors_are_typed(azure, azure_config):
    service = AzureMLService(azure_config)
    run(service.start(job()))
    azure.fake.faults.extend([("GET", 429, "TooManyRequests", "slow down"), ("GET", 503, "ServiceUnavailable", "busy")])
    assert run(service.describe("tm-a1")).phase is Phase.pending  # the SDK's own retries get through
    azure.fake.faults.extend([("GET", 503, "ServiceUnavailable", "busy")] * 4)  # past them: transient, for the broker
    with pytest.raises(TransientBackendError, match="busy"):
        run(service.describe("tm-a1"))
    azure.fake.jobs.clear()
    azure.fake.refusing = "InsufficientQuota: not enough quota for NCASv3_T4 in eastus"
    with pytest.raises(CapacityError, match="InsufficientQuota"):
        run(service.start(job()))
    with pytest.raises(BackendError, match="set azure.workspace"):
        run(AzureMLService(azure_config.model_copy(update={"workspace": None})).describe("tm-a1"))
