"""Azure settings (`azure:` in backends.yaml). Credentials are not kept here: azure-identity's chain
(environment, managed identity, `az login`) provides them."""

from __future__ import annotations

from pydantic import Field

from trainmaster.backends.base import BackendConfig


class AzureConfig(BackendConfig):
    subscription_id: str | None = Field(None, description="Subscription; default: AZURE_SUBSCRIPTION_ID.")
    resource_group: str | None = Field(None, description="Resource group of the Azure ML workspace.")
    workspace: str | None = Field(None, description="Azure ML workspace jobs are created in.")
    compute: str | None = Field(None, description="Compute cluster in the workspace; default: serverless.")
    storage_account: str | None = Field(None, description="Account where bundles and outputs are staged.")
    container: str = Field("trainmaster", description="Blob container in that account.")
