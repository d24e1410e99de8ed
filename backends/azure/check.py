"""Whether Azure credentials can be found here, without network access: a service principal in the
environment, or the Azure CLI's folder (`az login`). A managed identity takes the network; not seen."""

from __future__ import annotations

import os
from pathlib import Path

from trainmaster.backends.azure.config import AzureConfig


def credentials(config: AzureConfig) -> str | None:
    """Where credentials come from, or None."""
    if os.environ.get("AZURE_CLIENT_ID") and os.environ.get("AZURE_TENANT_ID"):
        return "environment (AZURE_CLIENT_ID)"
    cli_dir = Path(os.environ.get("AZURE_CONFIG_DIR", "~/.azure")).expanduser()
    return f"Azure CLI ({cli_dir})" if cli_dir.is_dir() else None


def check(config: AzureConfig) -> list[str]:
    if credentials(config):
        return []
    return ["no credentials found (set AZURE_CLIENT_ID and AZURE_TENANT_ID, or run `az login`)"]


def found(config: AzureConfig) -> list[str]:
    where = credentials(config)
    return [f"credentials: {where}"] if where else []
