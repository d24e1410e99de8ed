"""A small registry of backends, imported lazily so a missing cloud SDK only drops that backend."""

from __future__ import annotations

import importlib

from trainmaster.backends.base import Backend

# name -> "module:Class"; a backend module imports its SDK at module level, so importing it is the test.
BACKENDS: dict[str, str] = {
    "local": "trainmaster.backends.local:LocalBackend",
}


class UnknownBackend(KeyError):
    pass


def backend_class(name: str) -> type[Backend]:
    """The class registered as `name`; ImportError when its SDK (an extra) is not installed."""
    try:
        target = BACKENDS[name]
    except KeyError:
        raise UnknownBackend(f"unknown backend {name!r}; known: {', '.join(sorted(BACKENDS))}") from None
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)


def available() -> tuple[dict[str, type[Backend]], dict[str, str]]:
    """Backends that import, and name -> reason for those that do not."""
    found, missing = {}, {}
    for name in BACKENDS:
        try:
            found[name] = backend_class(name)
        except ImportError as exc:
            missing[name] = f"not installed ({exc.name or exc}); pip install 'trainmaster[{name}]'"
    return found, missing
