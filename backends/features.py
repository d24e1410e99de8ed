"""Capabilities as mixins: a backend inherits the ones it supports, and its feature list is derived.

A backend that lacks a feature must say why in `Backend.unsupported`, so the planner can print a
reason ("local: no spot instances: your own GPUs are never preempted") instead of a bare "no".
"""

from __future__ import annotations

from trainmaster.backends.base import Backend


class SupportsMultiGpu:
    """More than one GPU on a node."""


class SupportsMultiNode:
    """More than one node per run."""


class SupportsSpot:
    """Preemptible capacity at a discount; the run resumes from its last checkpoint."""


class SupportsRemoteData:
    """Reads s3://, gs:// or az:// inputs itself."""


FEATURES: dict[str, type] = {
    "multi_gpu": SupportsMultiGpu,
    "multi_node": SupportsMultiNode,
    "spot": SupportsSpot,
    "remote_data": SupportsRemoteData,
}


def supported(backend: type[Backend]) -> set[str]:
    return {name for name, mixin in FEATURES.items() if issubclass(backend, mixin)}


def unsupported(backend: type[Backend]) -> dict[str, str]:
    """Feature -> the backend's reason, for every feature it does not inherit."""
    return {
        name: backend.unsupported.get(name, "not supported by this backend")
        for name, mixin in FEATURES.items()
        if not issubclass(backend, mixin)
    }


def needed(spec) -> set[str]:
    """Features a spec needs."""
    need = set()
    if spec.resources.gpus > 1:
        need.add("multi_gpu")
    if spec.resources.nodes > 1:
        need.add("multi_node")
    if any(item.is_remote for item in spec.data):
        need.add("remote_data")
    return need
