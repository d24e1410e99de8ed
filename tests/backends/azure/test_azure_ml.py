"""The Azure ML training service against the strict fake, through the real MLClient: the job as the SDK sends it
(spot tier, instances, distribution, the inputs and the synced output as datastore URIs, limits), an idempotent
start, the state table with the billable time the job resource documents, stop, and typed errors (throttling, a
quota, a missing workspace); the fake refusing what Azure ML refuses."""

from __future__ import annotations

import asyncio
import json

import pytest

from trainmaster.backends.azure.azureml import AzureMLService
from trainmaster.backends.base import BackendError, Cause, ConfigurationError, Phase, TransientBackendError
from trainmaster.backends.managed.training_service import ServiceJob

pytest_plugins = ["clouds.conftest_azure"]


def run(coro):
    return asyncio.run(coro)


DS = "azureml://datastores/trainmaster_store/paths/trainmaster/"


def job(**changes) -> ServiceJob:
    fields = dict(name="tm-a1", image="img:1", env={"PYTHONUNBUFFERED": "1"}, instance="Standard_NC4as_T4_v3",
                  instance_count=2, spot=True, max_seconds=600, bundle_uri=DS + "bundles/b.tar",
                  input_uri=DS + "attempts/a1/input/", sync_uri=DS + "attempts/a1/sync/", model_uri=DS + "m/",
                  labels={"trainmaster-job": "j1", "trainmaster-attempt": "a1"})
    return ServiceJob(**{**fields, **changes})


def puts(azure, name="tm-a1"):
    return [json.loads(body) for method, path, body in azure.fake.log if method == "PUT" and path.endswith(f"/jobs/{name}")]


def test_the_job_as_the_sdk_sent_it(azure, azure_config):
    run(AzureMLService(azure_config).start(job()))
    [sent] = puts(azure)
    props = sent["properties"]
    assert props["jobType"] == "Command" and props["command"] == "python3 ${{inputs.trainmaster}}/boot.py"
    assert props["queueSettings"] == {"jobTier": "Spot"}
    assert props["resources"]["instanceCount"] == 2 and props["resources"]["instanceType"] == "Standard_NC4as_T4_v3"
    assert props["distribution"] == {"processCountPerInstance": 1, "distributionType": "PyTorch"}
    assert props["inputs"] == {
        "bundle": {"uri": DS + "bundles/b.tar", "mode": "Download", "jobInputType": "uri_file"},
        "trainmaster": {"uri": DS + "attempts/a1/input/", "mode": "Download", "jobInputType": "uri_folder"}}
    assert props["outputs"] == {"sync": {"uri": DS + "attempts/a1/sync/", "mode": "ReadWriteMount",
                                         "jobOutputType": "uri_folder"}}
    assert props["limits"] == {"timeout": "PT10M", "jobLimitsType": "Command"}
    assert props["environmentVariables"] == {"PYTHONUNBUFFERED": "1"}
    assert props["tags"] == {"trainmaster-job": "j1", "trainmaster-attempt": "a1"}
    assert props["environmentId"].endswith("/environments/CliV2AnonymousEnvironment/versions/"
                                           + props["environmentId"].rsplit("/", 1)[1])
    assert "computeId" not in props  # serverless: the offer's VM size


def test_one_node_on_demand_on_a_cluster_with_a_named_environment(azure, azure_config):
    config = azure_config.model_copy(update={"compute": "gpu-cluster", "environment": "azureml:torch-env:3"})
    run(AzureMLService(config).start(job(instance_count=1, spot=False, max_seconds=None)))
    props = puts(azure)[0]["properties"]
    assert "queueSettings" not in props  # a cluster's own tier is what runs
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


@pytest.mark.parametrize("status,phase,cause", [
    ("NotStarted", Phase.pending, None), ("Queued", Phase.pending, None), ("Preparing", Phase.pending, None),
    ("Provisioning", Phase.pending, None), ("Starting", Phase.pending, None), ("Running", Phase.running, None),
    ("Finalizing", Phase.running, None), ("Completed", Phase.succeeded, None), ("Failed", Phase.failed, None),
    ("CancelRequested", Phase.cancelled, Cause.cancelled), ("Canceled", Phase.cancelled, Cause.cancelled),
])
def test_states_map_to_phases_and_the_billable_time_is_what_the_resource_documents(azure, azure_config, status,
                                                                                   phase, cause):
    """The job resource documents its status and systemData only: a failure's cause is the backend's to find (the
    synced folder's exit record), and the run time billed is from its creation to its last change once ended."""
    import datetime

    service = AzureMLService(azure_config)
    run(service.start(job()))
    azure.fake.set_status("tm-a1", status)
    system = azure.fake.jobs["tm-a1"]["systemData"]
    created = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    system["createdAt"] = created.isoformat()
    system["lastModifiedAt"] = (created + datetime.timedelta(seconds=42.5)).isoformat()
    state = run(service.describe("tm-a1"))
    assert (state.phase, state.cause) == (phase, cause)
    assert state.started_at == created.timestamp()
    assert state.billable_seconds == (42.5 if phase.done else None)
    assert "systemData" in (state.billing_basis or "")


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
    with pytest.raises(ConfigurationError, match="InsufficientQuota"):
        run(service.start(job()))
    with pytest.raises(BackendError, match="set azure.workspace"):
        run(AzureMLService(azure_config.model_copy(update={"workspace": None})).describe("tm-a1"))


@pytest.mark.parametrize("change, rule", [
    ({"name": "tm-job.1"}, "job name"),  # a dot: the ARM name pattern has none
    ({"sync_uri": "https://acct.blob.core.windows.net/c/attempts/a1/sync/"}, "written through a datastore"),
    ({"bundle_uri": "azureml://datastores/nowhere/paths/b.tar"}, "does not have"),
])
def test_the_fake_refuses_what_azure_ml_refuses(azure, azure_config, change, rule):
    """The fake checks every request against the REST spec's rules and the workspace's datastores."""
    from clouds import checked

    with checked.expected() as refused:
        with pytest.raises(BackendError, match="UserError"):
            run(AzureMLService(azure_config).start(job(**change)))
    assert refused and any(rule in r for r in refused), refused
    assert azure.fake.jobs == {}
