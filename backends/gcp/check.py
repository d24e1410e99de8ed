"""Whether Google Cloud credentials can be found here, without network access: the configured key
file, GOOGLE_APPLICATION_CREDENTIALS, or the Application Default Credentials file `gcloud auth
application-default login` writes. (The metadata server of a GCE VM takes the network; not seen.)"""

from __future__ import annotations

import os
from pathlib import Path

from trainmaster.backends.gcp.config import GcpConfig


def credentials(config: GcpConfig) -> tuple[str | None, str | None]:
    """(where credentials come from, None) or (None, why none were found)."""
    named = [(config.credentials_file, "credentials_file"),
             (os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"), "GOOGLE_APPLICATION_CREDENTIALS")]
    for value, source in named:
        if value:
            path = Path(value).expanduser()
            return (f"{source} ({path})", None) if path.is_file() else (None, f"{source} names {path}, which does not exist")
    adc = _gcloud_dir() / "application_default_credentials.json"
    if adc.is_file():
        return f"application default credentials ({adc})", None
    return None, "no credentials found (set GOOGLE_APPLICATION_CREDENTIALS or run `gcloud auth application-default login`)"


def check(config: GcpConfig) -> list[str]:
    return [why] if (why := credentials(config)[1]) else []


def found(config: GcpConfig) -> list[str]:
    where = credentials(config)[0]
    return [f"credentials: {where}"] if where else []


def _gcloud_dir() -> Path:
    if os.environ.get("CLOUDSDK_CONFIG"):
        return Path(os.environ["CLOUDSDK_CONFIG"]).expanduser()
    if os.name == "nt" and os.environ.get("APPDATA"):
        return Path(os.environ["APPDATA"]) / "gcloud"
    return Path("~/.config/gcloud").expanduser()
