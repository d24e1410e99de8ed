"""The Blob object store against Azurite, through the real azure-storage-blob client: block uploads with
progress, ranged reads, recursive listing, server-side copy, streaming, missing blobs and typed errors."""

from __future__ import annotations

import asyncio
import os

import pytest

from trainmaster.backends.azure.blob import BlobStore
from trainmaster.backends.base import BackendError, TransientBackendError

pytest_plugins = ["clouds.conftest_azure"]


def run(coro):
    return asyncio.run(coro)


def test_a_large_file_goes_in_blocks_with_progress_and_reads_back_by_range(azure_config, tmp_path):
    store = BlobStore(azure_config)
    data = os.urandom(5 * 2**20 + 12345)
    (tmp_path / "big").write_bytes(data)
    seen = []
    run(store.upload(tmp_path / "big", "bundles/big.tar", lambda done, total: seen.append((done, total))))
    assert run(store.size("bundles/big.tar")) == len(data)
    assert len(seen) >= 6 and seen[-1] == (len(data), len(data))  # 1 MiB blocks: one call per block at least
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    blocks = store.container.get_blob_client(store.prefix + "bundles/big.tar").get_block_list()[0]
    assert len(blocks) == 6
    assert run(store.read("bundles/big.tar", 2**20 - 3, 10)) == data[2**20 - 3:2**20 + 7]
    assert run(store.read("bundles/big.tar", len(data) - 4)) == data[-4:]
    assert run(store.read("bundles/big.tar", len(data), 10)) == b""

    async def streamed(offset):
        return b"".join([chunk async for chunk in store.stream("bundles/big.tar", offset)])

    assert run(streamed(0)) == data
    assert run(streamed(3 * 2**20 + 1)) == data[3 * 2**20 + 1:]


def test_missing_blobs_listing_and_copy(azure, azure_config, tmp_path):
    store = BlobStore(azure_config)
    assert run(store.size("nothing")) is None and run(store.read("nothing")) is None
    assert run(store.list("attempts/")) == []  # the container is not there yet
    for key, body in (("attempts/a/sync/checkpoints/segments/00000001/manifest.json", b"{}"),
                      ("attempts/a/sync/outputs/metrics.jsonl", b"m1\n"), ("attempts/b/x", b"x")):
        (tmp_path / "f").write_bytes(body)
        run(store.upload(tmp_path / "f", key))
    found = {o.key: o.size for o in run(store.list("attempts/a/"))}
    assert found == {"attempts/a/sync/checkpoints/segments/00000001/manifest.json": 2,
                     "attempts/a/sync/outputs/metrics.jsonl": 3}
    run(store.copy("attempts/a/sync/outputs/metrics.jsonl", "attempts/c/sync/outputs/metrics.jsonl"))
    assert run(store.read("attempts/c/sync/outputs/metrics.jsonl")) == b"m1\n"
    assert store.uri("attempts/c/") == f"{azure.azurite.url}/{azure_config.container}/trainmaster/attempts/c/"


def test_a_copy_of_a_missing_blob_is_an_error_naming_it(azure_config, tmp_path):
    store = BlobStore(azure_config)
    (tmp_path / "f").write_bytes(b"x")
    run(store.upload(tmp_path / "f", "here"))
    with pytest.raises(BackendError, match="copy of gone"):
        run(store.copy("gone", "there"))


def test_an_unreachable_account_is_transient_and_no_account_is_named(azure_config, monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
                                                          "AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:9/devstoreaccount1;")
    store = BlobStore(azure_config.model_copy(update={"container": "c"}))
    store.container._config.retry_policy.total_retries = 0
    with pytest.raises(TransientBackendError):
        run(store.size("x"))
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    with pytest.raises(BackendError, match="set azure.storage_account"):
        BlobStore(azure_config).container
