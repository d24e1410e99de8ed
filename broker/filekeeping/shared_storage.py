"""`TRAINMASTER_SHARED_STORAGE`: where bundles and accepted outputs live so that any host sharing the database
can use them (docs/daemon.md, "Shared storage").

The setting is an absolute folder every host mounts, or an object-store prefix: `s3://bucket/prefix`,
`gs://bucket/prefix`, `az://container/prefix` (the managed backends' own stores, configured by backends.yaml's
`aws:`, `gcp:` and `azure:` sections for credentials, region and endpoint). Unset, nothing is shared: bundles and
outputs stay in `$TRAINMASTER_HOME` only, as before. Keys under it: `bundles/<sha256>.tar`,
`jobs/<job id>/outputs/<path>` and `jobs/<job id>/manifest.json` (broker/filekeeping/shared_bundles.py,
broker/filekeeping/shared_outputs.py).

Each SDK is imported only when its store is made. Where a job's outputs went is recorded in the database (a
`shared` event), so `trainmaster status` and `trainmaster outputs` find them without this setting.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from trainmaster.backends.base import LocalEnvironmentError

if TYPE_CHECKING:
    from trainmaster.backends.managed.store import ObjectStore

ENV = "TRAINMASTER_SHARED_STORAGE"
DATABASE_ENV = "TRAINMASTER_DATABASE_URL"
SCHEMES = ("s3://", "gs://", "az://")


class SharedStorageError(LocalEnvironmentError):
    """The shared storage is misconfigured, lacks something, or holds bytes that are not what was recorded:
    nothing of it is used, and the message names the location."""


def setting() -> str | None:
    """The setting as given (None when unset or blank); SharedStorageError when it is neither an absolute
    folder nor one of the object-store prefixes."""
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    if value.startswith(SCHEMES):
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
    """The object store over `root` (a setting's value, as recorded with what was put there)."""
    if not root.startswith(SCHEMES):
        from trainmaster.broker.shared_folder import FolderStore

        return FolderStore(Path(root))
    return _cloud_store(root)


def _cloud_store(root: str) -> ObjectStore:
    """The cloud's own ObjectStore over `root`, with its section of backends.yaml (credentials, region, endpoint)."""
    from trainmaster.backends.config import load_configs
    from trainmaster.broker import paths

    scheme, rest = root.split("://", 1)
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
    configs = load_configs(paths.config_dir())
    if scheme == "s3":
        from trainmaster.backends.aws.s3 import S3Store

        return S3Store(configs["aws"].model_copy(update={"s3_bucket": bucket, "s3_prefix": prefix}))
    if scheme == "gs":
        from trainmaster.backends.gcp.gcs import GcsStore

        return GcsStore(configs["gcp"].model_copy(update={"staging_bucket": f"gs://{bucket}/{prefix}"}))
    from trainmaster.backends.azure.blob import BlobStore

    return BlobStore(configs["azure"].model_copy(update={"container": bucket, "prefix": prefix}))
