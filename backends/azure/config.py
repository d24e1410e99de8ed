"""Azure settings (`azure:` in backends.yaml): the Azure ML workspace jobs run in and the Blob container they
stage through. Credentials are not kept here: azure-identity provides them (`credential` picks how)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from trainmaster.backends.managed.config import ManagedConfig


class AzureConfig(ManagedConfig):
    subscription_id: str | None = Field(None, description="Subscription; default: AZURE_SUBSCRIPTION_ID.")
    resource_group: str | None = Field(None, description="Resource group of the Azure ML workspace.")
    workspace: str | None = Field(None, description="Azure ML workspace jobs are created in.")
    region: str | None = Field(None, description="The workspace's region (eastus): only its catalog rows are "
                                                 "offered; default: any.")
    compute: str | None = Field(None, description="Compute cluster in the workspace; default: serverless (the "
                                                  "offer's VM size).")
    compute_vm_size: str | None = Field(None, description="The cluster's VM size (Standard_NC4as_T4_v3): with "
                                                          "`compute`, only that size is offered and priced, since it "
                                                          "is what runs.")
    compute_tier: Literal["dedicated", "low_priority"] = Field("dedicated", description="The cluster's tier: a "
                                                               "low-priority cluster is priced as spot.")
    datastore: str | None = Field(None, pattern=r"^[a-zA-Z0-9_]{1,255}$",
                                  description="The Azure ML datastore registered for `storage_account`/`container` "
                                              "(jobs read and write it as azureml://datastores/<datastore>/paths/…); "
                                              "required to dispatch.")
    environment: str | None = Field(None, description="An Azure ML environment (`azureml:name:version`) jobs run "
                                                      "in instead of an anonymous one over `image`.")
    storage_account: str | None = Field(None, description="Account where bundles and outputs are staged "
                                                          "(https://<account>.blob.core.windows.net).")
    storage_url: str | None = Field(None, description="The account's full blob endpoint instead of "
                                                      "`storage_account` (a sovereign cloud, a private endpoint). "
                                                      "AZURE_STORAGE_CONNECTION_STRING in the environment wins "
                                                      "over both (Azurite, an account key).")
    container: str = Field("trainmaster", description="Blob container in that account.")
    prefix: str = Field("trainmaster/", description="Blob name prefix inside the container.")
    credential: str = Field("default", description="How azure-identity signs in: `default` (its whole chain), "
                                                   "`cli` (`az login`), `environment` (a service principal in "
                                                   "AZURE_CLIENT_ID/…), `managed_identity`, or `module:function` "
                                                   "returning a TokenCredential (your own).")
    block_mb: int = Field(8, ge=1, le=4000, description="Block size of uploads, in MiB.")
    concurrency: int = Field(4, ge=1, le=64, description="Blocks uploaded at once.")
