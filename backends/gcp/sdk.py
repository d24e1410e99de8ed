"""The Google Cloud SDKs, imported only when called, so the backend imports without the `gcp` extra, and the
one place credentials and the project are resolved (key file, GOOGLE_APPLICATION_CREDENTIALS, ADC)."""

from __future__ import annotations

import asyncio
import json
import os

from trainmaster.backends.base import BackendError, ConfigurationError, TransientBackendError
from trainmaster.backends.gcp.config import GcpConfig

SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


def vertex():
    """google.cloud.aiplatform_v1: the low-level Vertex AI client and its protos (not the 1.2 s `aiplatform`)."""
    from google.cloud import aiplatform_v1

    return aiplatform_v1


def storage():
    from google.cloud import storage

    return storage


def credentials(config: GcpConfig):
    """(credentials, the project they name or None): the key file the config names (a service account's key or
    an authorized user's), else Google's default chain (GOOGLE_APPLICATION_CREDENTIALS, ADC)."""
    import google.auth
    from google.auth import exceptions as auth_errors

    try:
        if config.credentials_file:
            return _from_file(os.path.expanduser(config.credentials_file))
        return google.auth.default(scopes=SCOPES)
    except (auth_errors.GoogleAuthError, OSError, ValueError) as exc:
        raise ConfigurationError(f"gcp: no usable credentials ({exc}); set gcp.credentials_file or "
                                 "GOOGLE_APPLICATION_CREDENTIALS, or run `gcloud auth application-default login`") from None


def _from_file(path: str):
    from google.oauth2 import credentials as user, service_account

    with open(path) as handle:
        info = json.load(handle)
    kind = info.get("type") if isinstance(info, dict) else None
    if kind == "service_account":
        return service_account.Credentials.from_service_account_info(info, scopes=SCOPES), info.get("project_id")
    if kind == "authorized_user":
        return user.Credentials.from_authorized_user_info(info, scopes=SCOPES), info.get("quota_project_id")
    raise ValueError(f"{path} holds {kind!r} credentials; gcp.credentials_file takes a service account's key or "
                     "an authorized user's (name others in GOOGLE_APPLICATION_CREDENTIALS)")


def project(config: GcpConfig, found: str | None) -> str:
    """The project jobs are created in: the config's, the credentials', or GOOGLE_CLOUD_PROJECT."""
    chosen = config.project or found or os.environ.get("GOOGLE_CLOUD_PROJECT")
    if not chosen:
        raise ConfigurationError("gcp: no project (set gcp.project, or use credentials that name one)")
    return chosen


def typed(exc: BaseException, what: str) -> BackendError | None:
    """The core's typed error for an SDK failure while doing `what`; None when `exc` is not the SDK's."""
    import requests
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth_errors

    if isinstance(exc, (api.TooManyRequests, api.ServerError, api.RetryError, requests.ConnectionError,
                        requests.Timeout, auth_errors.TransportError)):
        return TransientBackendError(f"gcp: {what}: {exc} (may pass; retried)")
    if isinstance(exc, (api.Unauthorized, api.Forbidden, auth_errors.RefreshError)):
        return ConfigurationError(f"gcp: {what}: permission denied ({exc}); the credentials need access to it "
                                  "(docs/clouds.md lists the roles)")
    if isinstance(exc, api.NotFound) and "bucket" in str(exc).lower():
        return ConfigurationError(f"gcp: {what}: {exc} (create the bucket or fix gcp.staging_bucket)")
    if isinstance(exc, api.GoogleAPICallError):
        return BackendError(f"gcp: {what}: {exc}")
    return None


async def call(what: str, fn, *args, **kwargs):
    """`fn(*args, **kwargs)` off the event loop, its SDK errors raised as the core's typed errors."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except Exception as exc:
        mapped = typed(exc, what)
        if mapped is None:
            raise
        raise mapped from exc
