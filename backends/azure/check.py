"""Whether Azure can run jobs from here, without network access: credentials (a service principal in the
environment, or the Azure CLI's folder from `az login`), the Azure ML workspace jobs are created in, the
storage account they stage through and the datastore jobs name it by. A managed identity (`credential:
managed_identity`, or an Azure VM, App Service or Arc machine: backends/cloud_host.py) takes the network:
"not checked offline", not a reason to leave Azure out."""

from __future__ import annotations

import os
from pathlib import Path

from trainmaster.backends import cloud_host
from trainmaster.backends.azure.config import AzureConfig

CONNECTION_STRING = "AZURE_STORAGE_CONNECTION_STRING"


def credentials(config: AzureConfig) -> str | None:
    """Where credentials come from, or None."""
    if ":" in config.credential:
        return f"{config.credential} (configured)"
    if config.credential in ("default", "environment") and os.environ.get("AZURE_CLIENT_ID") and \
            os.environ.get("AZURE_TENANT_ID"):
        return "environment (AZURE_CLIENT_ID)"
    cli_dir = Path(os.environ.get("AZURE_CONFIG_DIR", "~/.azure")).expanduser()
    if config.credential in ("default", "cli") and cli_dir.is_dir():
        return f"Azure CLI ({cli_dir})"
    return None


def not_checked(config: AzureConfig) -> str | None:
    """A managed identity this check cannot see without the network, when one is configured or this machine has one."""
    if config.credential == "managed_identity":
        return "the managed identity azure.credential names"
    return cloud_host.azure() if config.credential == "default" else None


def check(config: AzureConfig) -> list[str]:
    reasons = []
    if not credentials(config) and not not_checked(config):
        reasons.append("no credentials found (set AZURE_CLIENT_ID and AZURE_TENANT_ID, or run `az login`)")
    missing = [name for name, value in (
        ("subscription_id (or AZURE_SUBSCRIPTION_ID)", config.subscription_id or os.environ.get("AZURE_SUBSCRIPTION_ID")),
        ("resource_group", config.resource_group), ("workspace", config.workspace)) if not value]
    if missing:
        reasons.append(f"no Azure ML workspace to create jobs in (set azure.{', azure.'.join(missing)})")
    if not (config.storage_account or config.storage_url or os.environ.get(CONNECTION_STRING)):
        reasons.append(f"no storage account to stage bundles and outputs in (set azure.storage_account or "
                       f"{CONNECTION_STRING})")
    if not config.datastore:
        reasons.append(f"azure.datastore is not set: the Azure ML datastore registered for the container "
                       f"{config.container} (jobs read and write it through the datastore)")
    if config.compute and not config.compute_vm_size:
        reasons.append(f"azure.compute is set: name the cluster's VM size as azure.compute_vm_size, so the offer "
                       "priced is the one that runs")
    return reasons


def found(config: AzureConfig) -> list[str]:
    where = credentials(config)
    if where:
        return [f"credentials: {where}"]
    identity = not_checked(config)
    return [f"credentials: not checked offline ({identity}, asked at dispatch)"] if identity else []
