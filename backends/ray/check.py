"""What `trainmaster backends check` reports about the Ray backend, off the network: the dashboard's address
and the shared storage path as set (the cluster itself is asked only when planning)."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from trainmaster.backends.ray.config import RayConfig


def check(config: RayConfig) -> list[str]:
    """Why the settings cannot run jobs (empty when they can)."""
    reasons = []
    url = urlsplit(config.address)
    if url.scheme not in ("http", "https") or not url.hostname:
        reasons.append(f"ray.address {config.address!r} is not the dashboard's http:// address "
                       "(e.g. http://head:8265)")
    if not config.storage_path:
        reasons.append("ray.storage_path is not set: a folder every node and this machine see at the same path")
    elif not os.path.isabs(config.storage_path):
        reasons.append(f"ray.storage_path {config.storage_path!r} is not an absolute path")
    elif not os.path.isdir(config.storage_path):
        reasons.append(f"ray.storage_path {config.storage_path} is not a folder on this machine (mount it here too)")
    return reasons


def found(config: RayConfig) -> list[str]:
    return [f"cluster at {config.address}" + (f", namespace {config.namespace}" if config.namespace else ""),
            f"storage path {config.storage_path or '(not set)'}"]
