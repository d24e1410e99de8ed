"""Whether Google Cloud credentials can be found here, without network access: the configured key
file, GOOGLE_APPLICATION_CREDENTIALS, or the Application Default Credentials file `gcloud auth
application-default login` writes, and whether the staging bucket and the project jobs are created in are
configured. On a GCE VM (or with GCE_METADATA_HOST) the service account the metadata server gives takes the
network: "not checked offline", not a reason to leave GCP out (backends/cloud_host.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from trainmaster.backends import cloud_host
from trainmaster.backends.gcp.config import GcpConfig


def located(config: GcpConfig) -> tuple[str, Path | None]:
    """(which setting names the credentials file, the file) or (why none was found, None)."""
    named = [(config.credentials_file, "credentials_file"),
             (os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"), "GOOGLE_APPLICATION_CREDENTIALS")]
    for value, source in named:
        if value:
            path = Path(value).expanduser()
            return (source, path) if path.is_file() else (f"{source} names {path}, which does not exist", None)
    adc = _gcloud_dir() / "application_default_credentials.json"
    if adc.is_file():
        return "application default credentials", adc
    return ("no credentials found (set GOOGLE_APPLICATION_CREDENTIALS or run `gcloud auth application-default "
            "login`)", None)


def credentials(config: GcpConfig) -> tuple[str | None, str | None]:
    """(where credentials come from, None) or (None, why none were found)."""
    said, path = located(config)
    return (f"{said} ({path})", None) if path else (None, said)


def project(config: GcpConfig) -> str | None:
    """The project from the config, GOOGLE_CLOUD_PROJECT, or the credentials file (read here, no network)."""
    if config.project or os.environ.get("GOOGLE_CLOUD_PROJECT"):
        return config.project or os.environ["GOOGLE_CLOUD_PROJECT"]
    path = located(config)[1]
    try:
        info = json.loads(path.read_text()) if path else {}
    except (OSError, ValueError):
        return None
    found = (info.get("project_id") or info.get("quota_project_id")) if isinstance(info, dict) else None
    return found if isinstance(found, str) and found else None


def check(config: GcpConfig) -> list[str]:
    why = credentials(config)[1]
    reasons = [why] if why and not cloud_host.gcp() else []
    if not config.staging_bucket:
        reasons.append("no staging bucket to dispatch to (set gcp.staging_bucket: gs://bucket/prefix)")
    if not project(config):
        reasons.append("no project to create jobs in (set gcp.project or GOOGLE_CLOUD_PROJECT, or use a key "
                       "file that names one)")
    return reasons


def found(config: GcpConfig) -> list[str]:
    where = credentials(config)[0]
    if where:
        return [f"credentials: {where}"]
    account = cloud_host.gcp()
    return [f"credentials: not checked offline ({account}, asked at dispatch)"] if account else []


def _gcloud_dir() -> Path:
    if os.environ.get("CLOUDSDK_CONFIG"):
        return Path(os.environ["CLOUDSDK_CONFIG"]).expanduser()
    if os.name == "nt" and os.environ.get("APPDATA"):
        return Path(os.environ["APPDATA"]) / "gcloud"
    return Path("~/.config/gcloud").expanduser()
