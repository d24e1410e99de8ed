"""Whether Azure can run jobs from here, without network access: credentials (a service principal in the
environment, or the Azure CLI's folder from `az login`; a managed identity takes the network, so it is not
seen), the Azure ML workspace jobs are created in, and the storage account they stage through."""

from __future__ import annotations

import os
from pathlib import Path

from trainmaster.backends.azure.config import AzureConfig

CONNECTION_STRING = "AZURE_STORAGE_CONNECTION_STRING"


def credentials(config: AzureConfig) -> str | None:
    """Where credentials come from, or None."""
    if ":" in config.credential:
        return f"{config.credential} (configured)"
    if os.environ.get("AZURE_CLIENT_ID") and os.environ.get("AZURE_TENANT_ID"):
        return "environment (AZURE_CLIENT_ID)"
    cli_dir = Path(os.environ.get("AZURE_CONFIG_DIR", "~/.azure")).expanduser()
    return f"Azure CLI ({cli_dir})" if cli_dir.is_dir() else None


def check(config: AzureConfig) -> list[str]:
    reasons = []
    if not credentials(config):
        reasons.append("no credentials found (set AZURE_CLIENT_ID and AZURE_TENANT_ID, or run `az login`)")
    missing = [name for name, value in (
        ("subscription_id (or AZURE_SUBSCRIPTION_ID)", config.subscription_id or os.environ.get("AZURE_SUBSCRIPTION_ID")),
        ("resource_group", config.resource_group), ("workspace", config.workspace)) if not value]
    if missing:
        reasons.append(f"no Azure ML workspace to create jobs in (set azure.{', azure.'.join(missing)})")
    if not (config.storage_account or config.storage_url or os.environ.get(CONNECTION_STRING)):
        reasons.append(f"no storage account to stage bundles and outputs in (set azure.storage_account or "
                       f"{CONNECTION_STRING})")
    return reasons


def found(config: AzureConfig) -> list[str]:
    where = credentials(config)
    return [f"credentials: {where}"] if where else []
