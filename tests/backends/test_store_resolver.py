"""The one resolver from a URI to an object store (backends/registry.py `store_for`): a folder, or the store of the
backend the registry names for the URI's scheme, made with that backend's section of backends.yaml."""

from __future__ import annotations

import asyncio

import pytest

from trainmaster.backends.aws.config import AwsConfig
from trainmaster.backends.azure.config import AzureConfig
from trainmaster.backends.base import BackendError
from trainmaster.backends.folder_store import FolderStore
from trainmaster.backends.gcp.config import GcpConfig
from trainmaster.backends.registry import store_for, store_schemes

CONFIGS = {"aws": AwsConfig(endpoint_url="http://127.0.0.1:9", region="eu-west-1"), "gcp": GcpConfig(project="p"),
           "azure": AzureConfig(storage_url="http://127.0.0.1:10000/devstoreaccount1")}


def test_the_schemes_are_the_registrys():
    assert store_schemes() == ("s3://", "gs://", "az://")


@pytest.mark.parametrize(("uri", "named"), [
    ("s3://bucket/runs/nightly", "s3://bucket/runs/nightly/key"),
    ("s3://bucket", "s3://bucket/key"),
    ("gs://bucket/runs/", "gs://bucket/runs/key"),
    ("az://container/runs", None),
])
def test_a_cloud_uri_gets_its_clouds_store_rooted_there_with_its_settings(uri, named):
    store = store_for(uri, CONFIGS)
    assert type(store).__name__ == {"s3": "S3Store", "gs": "GcsStore", "az": "BlobStore"}[uri[:2]]
    if named:
        assert store.uri("key") == named
    if uri.startswith("s3"):  # the cloud's own section of backends.yaml is kept (its endpoint, its region)
        assert (store.config.endpoint_url, store.config.region) == ("http://127.0.0.1:9", "eu-west-1")
    if uri.startswith("az"):
        assert (store.config.container, store.prefix, store.config.storage_url) == (
            "container", "runs/", "http://127.0.0.1:10000/devstoreaccount1")


def test_an_absolute_folder_is_a_folder_store(tmp_path):
    store = store_for(str(tmp_path), {})
    assert isinstance(store, FolderStore) and store.uri("a/b") == str(tmp_path / "a" / "b")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b").write_bytes(b"12345")
    assert asyncio.run(store.size("a/b")) == 5


def test_a_scheme_no_backend_serves_is_refused_naming_the_known_ones():
    with pytest.raises(BackendError, match=r"ftp://host/x: no object store is named ftp:// \(known: s3://, gs://, az://\)"):
        store_for("ftp://host/x", CONFIGS)
