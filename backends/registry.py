"""The one list of backends: each one's name, class, pip extra, config model and readiness check.

Everything else derives from it: the names a policy may use, the backends the broker dispatches
to, `trainmaster offers` and `trainmaster backends check`. Classes, config models and checks are
named as "module:attribute" strings and imported on demand, so reading the list imports no backend
and no SDK. Every backend dispatches in this version: `local`, `bittensor` (miners' signed quotes, gathered
live over the miner protocol) and the three managed training services (`aws` SageMaker, `gcp` Vertex AI,
`azure` Azure ML; backends/managed/), whose offers come from the price catalogs in `backends/catalog/`, and
`ray` (your own Ray cluster through its Jobs API, priced by the power model like `local`).
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from trainmaster.backends.base import Backend, BackendConfig


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
        ),
        BackendEntry(
            "gcp", "trainmaster.backends.gcp.backend:GcpBackend", extra="gcp",
            sdk=("google.cloud.aiplatform", "google.cloud.storage"), trusted=True, catalog=True,
            config="trainmaster.backends.gcp.config:GcpConfig", checks="trainmaster.backends.gcp.check",
        ),
        BackendEntry(
            "azure", "trainmaster.backends.azure.backend:AzureBackend", extra="azure", sdk=("azure.ai.ml", "azure.identity", "azure.storage.blob"),
            trusted=True, catalog=True,
            config="trainmaster.backends.azure.config:AzureConfig", checks="trainmaster.backends.azure.check",
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


def _resolve(target: str):
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _findable(module: str) -> bool:
    """Whether `module` is installed; a dotted name imports only its (namespace) parents."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False
