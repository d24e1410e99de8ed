"""The Azure SDKs, imported only when called, so the backend imports without the `azure` extra; and the one
place a credential is made from the config's `credential` setting."""

from __future__ import annotations

import asyncio
import importlib
import logging

from trainmaster.backends.base import BackendError, CapacityError, ConfigurationError, TransientBackendError

KINDS = {"default": "DefaultAzureCredential", "cli": "AzureCliCredential", "environment": "EnvironmentCredential",
         "managed_identity": "ManagedIdentityCredential"}


def ml():
    """azure.ai.ml, its own stderr chatter (experimental-class notices, studio URLs) quieted: what it says
    that matters comes back as errors, which trainmaster reports itself."""
    import azure.ai.ml
    import azure.ai.ml.entities
    import azure.ai.ml.operations  # noqa: F401 - imported to quiet the loggers it sets up

    for name, logger in list(logging.root.manager.loggerDict.items()):
        if name.startswith("azure.ai.ml") and isinstance(logger, logging.Logger):
            logger.setLevel(logging.ERROR)
    return azure.ai.ml


def identity():
    import azure.identity

    return azure.identity


def blob():
    import azure.storage.blob

    return azure.storage.blob


def errors():
    import azure.core.exceptions

    return azure.core.exceptions


def credential(kind: str):
    """A TokenCredential: one of azure-identity's (`KINDS`), or what `module:function` returns."""
    if kind in KINDS:
        return getattr(identity(), KINDS[kind])()
    module, _, function = kind.partition(":")
    if not module or not function:
        raise BackendError(f"azure.credential {kind!r} is neither one of {', '.join(KINDS)} nor module:function")
    try:
        return getattr(importlib.import_module(module), function)()
    except (ImportError, AttributeError) as exc:
        raise BackendError(f"azure.credential {kind!r} cannot be loaded: {exc}") from None


CAPACITY_WORDS = ("insufficientcapacity", "capacity", "allocationfailed", "skunotavailable")
QUOTA_WORDS = ("quota",)
"""A quota refusal (a new subscription has no low-priority or GPU family cores) is the set-up's, not capacity's."""
MISSING_WORDS = ("workspacenotfound", "resourcegroupnotfound", "datastorenotfound", "computenotfound")


def typed(exc: Exception, what: str) -> BackendError:
    """An Azure SDK error as the core's typed error: throttling, 5xx and connections transient; a capacity refusal
    a CapacityError; missing credentials, a permission, a quota or a missing workspace, datastore or compute a
    ConfigurationError (the set-up's: the backend is not tried again for the job); the rest a BackendError."""
    e = errors()
    text = f"{what}: {_said(exc)}"
    words = text.lower().replace(" ", "")
    if isinstance(exc, e.ClientAuthenticationError):
        return ConfigurationError(f"{text} (Azure credentials missing or refused: run `az login`, or set "
                                  "azure.credential)")
    if isinstance(exc, (e.ServiceRequestError, e.ServiceResponseError)):
        return TransientBackendError(text)
    status = getattr(exc, "status_code", None)
    if status == 429 or (status is not None and status >= 500):
        return TransientBackendError(text)
    if any(word in words for word in QUOTA_WORDS):
        return ConfigurationError(f"{text} (request a quota increase for the VM family in the workspace's region)")
    if any(word in words for word in CAPACITY_WORDS):
        return CapacityError(text)
    if status == 403:
        return ConfigurationError(f"{text} (the credential lacks permission for this: docs/clouds.md lists the role)")
    if any(word in words for word in MISSING_WORDS):
        return ConfigurationError(text)
    return BackendError(text)


def _said(exc: Exception) -> str:
    """What the service said: its error's code and message, else the SDK's first line."""
    error = getattr(exc, "error", None)
    if getattr(error, "message", None):
        return f"{error.code}: {error.message}" if error.code else error.message
    return (str(getattr(exc, "message", None) or exc).strip().splitlines() or [type(exc).__name__])[0]


async def call(what: str, function, *args, **kwargs):
    """`function(*args, **kwargs)` in a thread, its Azure errors typed (`typed`)."""
    try:
        return await asyncio.to_thread(function, *args, **kwargs)
    except errors().AzureError as exc:
        raise typed(exc, what) from exc
