"""`TRAINMASTER_SHARED_STORAGE`: where bundles and accepted outputs live so that any host sharing the database
can use them (docs/daemon.md, "Shared storage").

The setting is an absolute folder every host mounts, or an object-store prefix: `s3://bucket/prefix`,
`gs://bucket/prefix`, `az://container/prefix` (the managed backends' own stores, configured by backends.yaml's
`aws:`, `gcp:` and `azure:` sections for credentials, region and endpoint). Unset, nothing is shared: bundles and
outputs stay in `$TRAINMASTER_HOME` only, as before. Keys under it: `bundles/<sha256>.tar`,
`jobs/<job id>/outputs/<path>` and `jobs/<job id>/manifest.json` (broker/filekeeping/shared_bundles.py,
broker/filekeeping/shared_outputs.py).

The store is the backends' (`registry.store_for`, the one resolver from a URI to a store: the broker names no
cloud), and its SDK is imported only when it is made. Where a job's outputs went is recorded in the database (a
`shared` event), so `trainmaster status` and `trainmaster outputs` find them without this setting.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from trainmaster.backends.base import LocalEnvironmentError

if TYPE_CHECKING:
    from trainmaster.backends.object_store import ObjectStore

ENV = "TRAINMASTER_SHARED_STORAGE"
DATABASE_ENV = "TRAINMASTER_DATABASE_URL"


def schemes() -> tuple[str, ...]:
    """The object-store prefixes the setting may name (`s3://`, `gs://`, `az://`: the backends' registry's)."""
    from trainmaster.backends.registry import store_schemes

    return store_schemes()


class SharedStorageError(LocalEnvironmentError):
    """The shared storage is misconfigured, lacks something, or holds bytes that are not what was recorded:
    nothing of it is used, and the message names the location."""


def setting() -> str | None:
    """The setting as given (None when unset or blank); SharedStorageError when it is neither an absolute
    folder nor one of the object-store prefixes."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    if value.startswith(schemes()):
        bucket = value.split("://", 1)[1].split("/", 1)[0]
        if not bucket:
            raise SharedStorageError(f"{ENV}={value}: no bucket or container after the scheme")
        return value.rstrip("/")
    if "://" in value or not Path(value).is_absolute():
        raise SharedStorageError(f"{ENV}={value}: give an absolute folder every host mounts, or s3://bucket/prefix, "
                                 "gs://bucket/prefix or az://container/prefix")
    return str(Path(value))


def check_database() -> None:
    """A broker on a PostgreSQL database is shared between hosts: a bundle built on one must be readable on the
    others, so building one there without shared storage is refused."""
    if os.environ.get(DATABASE_ENV, "").startswith(("postgresql://", "postgres://")) and setting() is None:
        raise SharedStorageError(
            f"{DATABASE_ENV} names a PostgreSQL server, shared by several hosts, but {ENV} is not set: set it to a "
            "folder every host mounts or to s3://bucket/prefix, gs://bucket/prefix or az://container/prefix, so "
            "that bundles and outputs are not kept on this host alone")


def store() -> ObjectStore | None:
    """The shared storage's object store; None when the setting is unset."""
    root = setting()
    return None if root is None else store_at(root)


def store_at(root: str) -> ObjectStore:
    """The object store over `root` (a setting's value, as recorded with what was put there): the backends'
    resolver (`registry.store_for`), with backends.yaml's sections for the clouds' credentials, region and endpoint
    (read only for a cloud's store)."""
    from trainmaster.backends.registry import store_for

    if not root.startswith(schemes()):
        return store_for(root, {})
    from trainmaster.broker.backend_set import read_configs

    return store_for(root, read_configs())
