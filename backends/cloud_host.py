"""Whether this machine is one of a cloud's own, told without the network: where the credentials a readiness check
cannot find may still come from at dispatch.

An EC2 instance's role, a GCE VM's service account and an Azure VM's managed identity are served by the
machine's metadata endpoint, which the offline checks (`backends check`, planning's readiness gate) never call.
On such a machine "no credentials found" would be wrong: the checks say "not checked offline" instead, and the
backend is planned; a refusal at dispatch then ends its attempt once (`ConfigurationError`). What is read:

* the machine's DMI identification (`/sys/devices/virtual/dmi/id/`): EC2's `sys_vendor` "Amazon EC2" (or a
  `board_asset_tag` of an instance id), Google's `product_name` "Google Compute Engine", Azure's
  `chassis_asset_tag` 7783-7084-3265-9085-8269-3286-77;
* the variables each platform sets for a workload's identity: ECS/EKS container credentials
  (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI / _FULL_URI), GCE_METADATA_HOST, App Service / Arc managed identity
  (IDENTITY_ENDPOINT, MSI_ENDPOINT).
"""

from __future__ import annotations

import os
from pathlib import Path

DMI_ROOT = Path("/sys/devices/virtual/dmi/id")
AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"


def _dmi(field: str) -> str:
    try:
        return (DMI_ROOT / field).read_text(errors="replace").strip()
    except OSError:
        return ""


def aws() -> str | None:
    """Where AWS credentials would come from on this machine without a file or variable, or None."""
    if os.environ.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") or os.environ.get("AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        return "the container's task or pod role (ECS/EKS)"
    if _dmi("sys_vendor") == "Amazon EC2" or _dmi("board_asset_tag").startswith("i-"):
        return "this EC2 instance's role (its metadata service)"
    return None


def gcp() -> str | None:
    if os.environ.get("GCE_METADATA_HOST"):
        return f"the metadata server at {os.environ['GCE_METADATA_HOST']} (GCE_METADATA_HOST)"
    if "Google Compute Engine" in _dmi("product_name") or _dmi("sys_vendor") == "Google":
        return "this VM's service account (the GCE metadata server)"
    return None


def azure() -> str | None:
    if os.environ.get("IDENTITY_ENDPOINT") or os.environ.get("MSI_ENDPOINT"):
        return "the managed identity of this App Service or Arc machine (IDENTITY_ENDPOINT)"
    if _dmi("chassis_asset_tag") == AZURE_ASSET_TAG:
        return "this Azure VM's managed identity (its metadata service)"
    return None
