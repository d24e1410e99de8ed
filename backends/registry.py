"""The one list of backends: each one's name, class, pip extra, config model and readiness check.

Everything else derives from it: the names a policy may use, the backends the broker dispatches
to, `trainmaster offers` and `trainmaster backends check`, and which cloud's object store a URI names
(`store_for`, the one resolver: the broker's shared storage and the triggers name stores by URI). Classes,
config models, checks and stores are named as "module:attribute" strings and imported on demand, so reading
the list imports no backend and no SDK. Every backend dispatches in this version: `local`, `bittensor` (miners' signed quotes, gathered
live over the miner protocol) and the three managed training services (`aws` SageMaker, `gcp` Vertex AI,
`azure` Azure ML; backends/managed/), whose offers come from the price catalogs in `backends/catalog/`, and
`ray` (your own Ray cluster through its Jobs API, priced by the power model like `local`).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trainmaster.backends.base import Backend, BackendConfig, BackendError

if TYPE_CHECKING:
    from trainmaster.backends.object_store import ObjectStore


@dataclass(frozen=True)
class BackendEntry:
    name: str
    target: str | None
    """"module:Class" of the Backend; None while it is planned (not dispatched in this version)."""
    extra: str | None
    """The pip extra that installs its SDK (`pip install 'trainmaster[aws]'`)."""
    sdk: tuple[str, ...]
    """The SDK's modules, looked up (not imported) to tell whether the extra is installed."""
    config: str
    """"module:Class" of its BackendConfig model (its section of backends.yaml)."""
    checks: str
    """Module with `found(config) -> list[str]` (what it found here: hardware, where credentials
    come from) and `check(config) -> list[str]` (why it cannot run here, beyond the extra and
    dispatch that `readiness` adds). The one readiness check: the class declares none."""
    trusted: bool
    """Runs on compute the user controls (their machine, their cloud account). The broker stamps every
    offer of this backend with it, whatever the offer says: an untrusted executor's work is replay-audited
    and paid only when accepted."""
    catalog: bool = False
    """Its offers come from a price catalog (`backends/catalog/<name>.csv`)."""
    uri_scheme: str | None = None
    """The URI scheme its object store is named by (`s3` for `s3://bucket/prefix`), None when it has none."""
    store: str | None = None
    """"module:Class" of its ObjectStore (backends/object_store.py), made over a URI with its section of backends.yaml."""

    @property
    def implemented(self) -> bool:
        """The broker can dispatch runs to it in this version."""
        return self.target is not None

    def backend_class(self) -> type[Backend]:
        if self.target is None:
            raise UnknownBackend(f"{self.name}: dispatch is not available in this version")
        return _resolve(self.target)

    def config_model(self) -> type[BackendConfig]:
        return _resolve(self.config)

    def store_class(self) -> type[ObjectStore]:
        return _resolve(self.store)

    def readiness(self, config: BackendConfig) -> tuple[list[str], list[str]]:
        """(why it cannot run jobs here, what it found); no reasons means ready. Cheap: no network,
        and the SDK is looked up, never imported."""
        module = importlib.import_module(self.checks)
        reasons = []
        if self.extra and not all(_findable(name) for name in self.sdk):
            reasons.append(f"extra not installed (pip install 'trainmaster[{self.extra}]')")
        reasons += module.check(config)
        if not self.implemented:
            reasons.append("dispatch not available in this version" + (" (catalog prices only)" if self.catalog else ""))
        return reasons, module.found(config)


REGISTRY: dict[str, BackendEntry] = {
    entry.name: entry
    for entry in (
        BackendEntry(
            "local", "trainmaster.backends.local:LocalBackend", extra=None, sdk=(), trusted=True,
            config="trainmaster.backends.local.config:LocalConfig", checks="trainmaster.backends.local.check",
        ),
        BackendEntry(
            "bittensor", "trainmaster.backends.bittensor.backend:BittensorBackend", extra="bittensor", sdk=("bittensor",), trusted=False,
            config="trainmaster.backends.bittensor.config:BittensorConfig",
            checks="trainmaster.backends.bittensor.check",
        ),
        BackendEntry(
            "aws", "trainmaster.backends.aws.backend:AwsBackend", extra="aws", sdk=("boto3",), trusted=True, catalog=True,
            config="trainmaster.backends.aws.config:AwsConfig", checks="trainmaster.backends.aws.check",
            uri_scheme="s3", store="trainmaster.backends.aws.s3:S3Store",
        ),
        BackendEntry(
            "gcp", "trainmaster.backends.gcp.backend:GcpBackend", extra="gcp",
            sdk=("google.cloud.aiplatform", "google.cloud.storage"), trusted=True, catalog=True,
            config="trainmaster.backends.gcp.config:GcpConfig", checks="trainmaster.backends.gcp.check",
            uri_scheme="gs", store="trainmaster.backends.gcp.gcs:GcsStore",
        ),
        BackendEntry(
            "azure", "trainmaster.backends.azure.backend:AzureBackend", extra="azure", sdk=("azure.ai.ml", "azure.identity", "azure.storage.blob"),
            trusted=True, catalog=True,
            config="trainmaster.backends.azure.config:AzureConfig", checks="trainmaster.backends.azure.check",
            uri_scheme="az", store="trainmaster.backends.azure.blob:BlobStore",
        ),
        BackendEntry(
            "ray", "trainmaster.backends.ray.backend:RayBackend", extra="ray", sdk=("ray",), trusted=True,
            config="trainmaster.backends.ray.config:RayConfig", checks="trainmaster.backends.ray.check",
        ),
    )
}

NAMES: tuple[str, ...] = tuple(REGISTRY)
"""Every backend name a policy may use, in the order they are listed."""

BACKENDS: dict[str, str] = {name: e.target for name, e in REGISTRY.items() if e.target is not None}
"""The backends this version dispatches to: name -> "module:Class"."""


class UnknownBackend(KeyError):
    """Not a backend this version can dispatch to."""


def entry(name: str) -> BackendEntry:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownBackend(f"unknown backend {name!r}; known: {', '.join(NAMES)}") from None


def trusted(name: str) -> bool:
    """Whether the backend of record `name` runs on trusted compute; a name the registry does not
    list is never trusted."""
    found = REGISTRY.get(name)
    return found.trusted if found is not None else False


def backend_class(name: str) -> type[Backend]:
    """The class registered as `name`; UnknownBackend for a name this version cannot dispatch to."""
    return entry(name).backend_class()


def store_schemes() -> tuple[str, ...]:
    """The URI prefixes an object store can be named by (`s3://`, `gs://`, `az://`)."""
    return tuple(f"{e.uri_scheme}://" for e in REGISTRY.values() if e.uri_scheme)


def split_uri(uri: str) -> tuple[str, str, str]:
    """(scheme, bucket, prefix) of `scheme://bucket/prefix`, the prefix empty or ending in "/"."""
    scheme, _, rest = uri.partition("://")
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    return scheme, bucket, prefix + "/" if prefix else ""


def store_for(uri: str, configs: Mapping[str, BackendConfig]) -> ObjectStore:
    """The one resolver from a URI to its object store: an absolute folder every host mounts
    (backends/folder_store.py), or `s3://`, `gs://` or `az://bucket/prefix`, the store of the backend registered
    for that scheme, made with that backend's section of backends.yaml (`configs`: credentials, region, endpoint).
    Its SDK is imported only here, when the store is made. BackendError for a scheme no backend serves."""
    if "://" not in uri:
        from trainmaster.backends.folder_store import FolderStore

        return FolderStore(Path(uri))
    scheme, bucket, prefix = split_uri(uri)
    found = next((e for e in REGISTRY.values() if e.uri_scheme == scheme and e.store), None)
    if found is None:
        raise BackendError(f"{uri}: no object store is named {scheme}:// (known: {', '.join(store_schemes())})")
    return found.store_class().at(configs[found.name], bucket, prefix)


def _resolve(target: str):
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _findable(module: str) -> bool:
    """Whether `module` is installed; a dotted name imports only its (namespace) parents."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False
