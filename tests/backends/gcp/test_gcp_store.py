"""The GCS object store (backends/gcp/gcs.py) with the real storage client against gcp-storage-emulator."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest
import requests
from google.api_core import exceptions as api

from trainmaster.backends.base import BackendError, ConfigurationError, TransientBackendError
from trainmaster.backends.gcp import sdk
from trainmaster.backends.gcp.config import GcpConfig
from trainmaster.backends.gcp.gcs import GcsStore

pytest_plugins = ["clouds.conftest_gcp"]


@pytest.fixture
def store(gcp):
    return GcsStore(GcpConfig(**gcp.config(gcp.credentials), upload_chunk_mb=1))


def run(coro):
    return asyncio.run(coro)


def test_a_large_file_goes_up_in_parts_with_progress(store, gcp, tmp_path):
    data = os.urandom(5 * 2**20 + 12345)
    path = tmp_path / "bundle.tar"
    path.write_bytes(data)
    seen = []
    run(store.upload(path, "bundles/x.tar", lambda done, total: seen.append((done, total))))
    assert run(store.size("bundles/x.tar")) == len(data)
    blob = gcp.storage_client().bucket("tm-staging").get_blob("runs/bundles/x.tar")
    assert blob.md5_hash == __import__("base64").b64encode(hashlib.md5(data).digest()).decode()
    done = [d for d, _ in seen]
    assert done == sorted(done) and done[-1] == len(data) and {t for _, t in seen} == {len(data)}
    assert {d for d in done if 0 < d < len(data)} >= {2**20 * k for k in range(1, 6)}  # one step per 1 MiB part


def test_ranged_reads_and_missing_objects(store, tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"0123456789")
    run(store.upload(path, "a/job.log"))
    assert run(store.read("a/job.log")) == b"0123456789"
    assert run(store.read("a/job.log", 3, 4)) == b"3456"
    assert run(store.read("a/job.log", 8, 100)) == b"89"
    assert run(store.read("a/job.log", 10, 5)) == b""
    assert run(store.read("a/missing")) is None
    assert run(store.size("a/missing")) is None


def test_stream_gives_the_bytes_from_an_offset(store, tmp_path, monkeypatch):
    monkeypatch.setattr("trainmaster.backends.gcp.gcs.STREAM_CHUNK", 4)
    path = tmp_path / "f"
    path.write_bytes(b"abcdefghij")
    run(store.upload(path, "f"))

    async def collect():
        return [chunk async for chunk in store.stream("f", 2)]

    assert run(collect()) == [b"cdef", b"ghij"]


def test_listing_is_recursive_and_relative_to_the_prefix(store, gcp, tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"xyz")
    for key in ("attempts/a/checkpoints/outputs/m.bin", "attempts/a/checkpoints/job.log", "attempts/b/x"):
        run(store.upload(path, key))
    gcp.storage_client().bucket("tm-staging").blob("elsewhere/attempts/a/y").upload_from_string(b"no")
    found = run(store.list("attempts/a/"))
    assert sorted((o.key, o.size) for o in found) == [("attempts/a/checkpoints/job.log", 3),
                                                      ("attempts/a/checkpoints/outputs/m.bin", 3)]
    assert store.uri("attempts/a/") == "gs://tm-staging/runs/attempts/a/"


def test_copy_stays_in_the_store(store, tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"segment")
    run(store.upload(path, "attempts/a/checkpoints/checkpoints/segments/00000001/state.pt"))
    run(store.copy("attempts/a/checkpoints/checkpoints/segments/00000001/state.pt", "attempts/b/checkpoints/s.pt"))
    assert run(store.read("attempts/b/checkpoints/s.pt")) == b"segment"


def test_a_missing_bucket_is_named(gcp):
    missing = GcsStore(GcpConfig(**{**gcp.config(gcp.credentials), "staging_bucket": "gs://no-such-bucket"}))
    with pytest.raises(ConfigurationError, match="no-such-bucket"):
        run(missing.list("x/"))


@pytest.mark.parametrize("error, typed", [
    (api.TooManyRequests("slow down"), TransientBackendError), (api.ServiceUnavailable("busy"), TransientBackendError),
    (api.InternalServerError("oops"), TransientBackendError),
    (requests.ConnectionError("reset"), TransientBackendError),
    (api.Forbidden("storage.objects.get denied"), ConfigurationError), (api.NotFound("no bucket"), ConfigurationError),
    (api.NotFound("no such object"), BackendError),
])
def test_sdk_errors_become_typed_errors(error, typed):
    found = sdk.typed(error, "reading gs://b/k")
    assert type(found) is typed and "reading gs://b/k" in str(found)
    assert sdk.typed(KeyError("ours"), "x") is None


def test_without_a_staging_bucket_it_says_what_to_set(gcp):
    with pytest.raises(BackendError, match="gcp.staging_bucket"):
        GcsStore(GcpConfig(**{**gcp.config(gcp.credentials), "staging_bucket": None}))
