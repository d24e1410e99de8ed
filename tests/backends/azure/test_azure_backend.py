"""The Azure backend over Azurite and the Azure ML fake (real SDK clients): submit stores the bundle once under
its sha256 and hands Azure ML the blob URLs; a resumed attempt gets its predecessor's checkpoints copied on the
store's side before its job starts; the readiness check says what is missing without the network."""

from __future__ import annotations

import asyncio
import json

import pytest

from trainmaster.backends.azure.backend import AzureBackend
from trainmaster.backends.azure.check import check, found
from trainmaster.backends.azure.config import AzureConfig
from trainmaster.backends.base import AttemptContext, Offer
from trainmaster.jobs import launch_plan as plan
from trainmaster.jobs.spec import JobSpec

pytest_plugins = ["clouds.conftest_azure"]
SHA = "b" * 64


def ctx(attempt: str, resume_from: str | None = None) -> AttemptContext:
    return AttemptContext(job_id="job1", attempt_id=attempt, bundle_sha256=SHA, seed=7, workdir="/nonexistent",
                          resume_from=resume_from)


OFFER = Offer(backend="azure", instance="Standard_NC4as_T4_v3", region="eastus", gpu_type="T4", gpu_count=1,
              spot=True, price_per_hour_micro_usd=157_800)
SPEC = JobSpec.model_validate({"name": "t", "entrypoint": "python train.py"})


def test_the_bundle_is_stored_once_and_a_resumed_attempt_starts_from_its_predecessors_checkpoints(
        azure, azure_config, tmp_path):
    backend = AzureBackend(azure_config)
    bundle = tmp_path / "bundle.tar"
    bundle.write_bytes(b"x" * 3000)
    uploads = []
    upload = backend.store.upload
    backend.store.upload = lambda path, key, progress=None: uploads.append(key) or upload(path, key, progress)
    first = asyncio.run(backend.submit(bundle, SPEC, OFFER, ctx("a1")))
    props = azure.fake.properties(first.data["name"])
    datastore = "azureml://datastores/trainmaster_store/paths/trainmaster/"
    assert props["inputs"]["bundle"]["uri"] == datastore + f"bundles/{SHA}.tar"
    assert props["inputs"]["trainmaster"]["uri"] == datastore + "attempts/a1/input/"
    assert props["outputs"]["sync"]["uri"] == datastore + "attempts/a1/sync/"
    assert props["command"] == "python3 ${{inputs.trainmaster}}/boot.py"
    assert plan.VARIABLE not in (props.get("environmentVariables") or {})  # the plan is a file of the input
    launch = plan.LaunchPlan.model_validate_json(asyncio.run(backend.store.read("attempts/a1/input/launch.json")))
    assert (launch.service, launch.bundle, launch.sync) == ("azureml", "", "")
    assert props["queueSettings"] == {"jobTier": "Spot"} and props["tags"]["trainmaster-attempt"] == "a1"

    segment = tmp_path / "manifest.json"
    segment.write_text(json.dumps({"step": 25}))
    asyncio.run(backend.store.upload(segment, "attempts/a1/sync/checkpoints/segments/00000001/manifest.json"))
    checkpoint = asyncio.run(backend.last_checkpoint(first))
    assert (checkpoint.segment, checkpoint.step) == (1, 25)
    asyncio.run(backend.submit(bundle, SPEC, OFFER, ctx("a2", resume_from=checkpoint.uri)))
    assert uploads.count(f"bundles/{SHA}.tar") == 1  # the second attempt found it there
    carried = asyncio.run(backend.store.read("attempts/a2/sync/checkpoints/segments/00000001/manifest.json"))
    assert json.loads(carried) == {"step": 25}


def test_readiness_names_what_is_missing(monkeypatch, tmp_path):
    from trainmaster.backends import cloud_host

    monkeypatch.setattr(cloud_host, "DMI_ROOT", tmp_path / "no-dmi")  # not an Azure VM, wherever the test runs
    for name in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_SUBSCRIPTION_ID", "AZURE_STORAGE_CONNECTION_STRING",
                 "IDENTITY_ENDPOINT", "MSI_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(tmp_path / "no-az"))
    reasons = check(AzureConfig())
    assert reasons == [
        "no credentials found (set AZURE_CLIENT_ID and AZURE_TENANT_ID, or run `az login`)",
        "no Azure ML workspace to create jobs in (set azure.subscription_id (or AZURE_SUBSCRIPTION_ID), "
        "azure.resource_group, azure.workspace)",
        "no storage account to stage bundles and outputs in (set azure.storage_account or "
        "AZURE_STORAGE_CONNECTION_STRING)",
        "azure.datastore is not set: the Azure ML datastore registered for the container trainmaster (jobs read "
        "and write it through the datastore)",
    ]
    ready = AzureConfig(subscription_id="s", resource_group="rg", workspace="ws", storage_account="acct",
                        datastore="tm_store", credential="clouds.azure_credential:fake")
    assert check(ready) == [] and found(ready) == ["credentials: clouds.azure_credential:fake (configured)"]
    cluster = ready.model_copy(update={"compute": "gpu-cluster"})
    assert check(cluster) == ["azure.compute is set: name the cluster's VM size as azure.compute_vm_size, so the "
                              "offer priced is the one that runs"]


def test_a_managed_identity_is_not_checked_offline_rather_than_missing(monkeypatch, tmp_path):
    """A managed identity answers only over the network: named as not checked offline, and no reason to leave Azure
    out of planning (a refusal at dispatch ends the attempt once)."""
    from trainmaster.backends import cloud_host

    monkeypatch.setattr(cloud_host, "DMI_ROOT", tmp_path / "no-dmi")
    for name in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "IDENTITY_ENDPOINT", "MSI_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(tmp_path / "no-az"))
    config = AzureConfig(subscription_id="s", resource_group="rg", workspace="ws", storage_account="acct",
                         datastore="tm_store", credential="managed_identity")
    assert check(config) == []
    assert found(config) == ["credentials: not checked offline (the managed identity azure.credential names, asked "
                             "at dispatch)"]
    monkeypatch.setenv("IDENTITY_ENDPOINT", "http://169.254.169.254/msi")  # an App Service or Arc machine
    default = config.model_copy(update={"credential": "default"})
    assert check(default) == [] and "not checked offline" in found(default)[0]


def test_an_unknown_credential_is_named(azure_config):
    from trainmaster.backends.azure.sdk import credential
    from trainmaster.backends.base import BackendError

    with pytest.raises(BackendError, match="neither one of default, cli"):
        credential("nonsense")
    with pytest.raises(BackendError, match="cannot be loaded"):
        credential("clouds.azure_credential:missing")


def test_on_a_compute_cluster_only_its_vm_size_and_tier_are_offered(azure_config):
    """On a cluster the cluster's VM size and tier are what run: the offers priced are those, nothing else."""
    from trainmaster.backends.base import OfferRequest

    spec = JobSpec.model_validate({"name": "t", "entrypoint": "python train.py", "resources": {"gpus": 1}})
    cluster = azure_config.model_copy(update={"compute": "gpu-cluster", "compute_vm_size": "Standard_NC4as_T4_v3",
                                              "compute_tier": "low_priority", "region": "eastus"})
    found = asyncio.run(AzureBackend(cluster).offers(OfferRequest(spec=spec)))
    assert {(o.instance, o.spot) for o in found.offers} == {("Standard_NC4as_T4_v3", True)}
    dedicated = cluster.model_copy(update={"compute_tier": "dedicated", "compute_vm_size": "Standard_NC99_none"})
    none = asyncio.run(AzureBackend(dedicated).offers(OfferRequest(spec=spec)))
    assert none.offers == [] and "runs Standard_NC99_none dedicated" in none.reasons[0]
    serverless = asyncio.run(AzureBackend(azure_config.model_copy(update={"region": "eastus"})).offers(
        OfferRequest(spec=spec)))
    assert len({o.instance for o in serverless.offers}) > 1
