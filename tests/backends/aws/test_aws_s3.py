"""The S3 object store (backends/aws/s3.py) with the real boto3 client against moto on 127.0.0.1: multipart upload
with progress, the content-addressed bundle skip, ranged reads, streaming, recursive listing, server-side copy,
and S3's errors as the core's typed errors."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest

from clouds import checked
from clouds.aws_server import BUCKET
from trainmaster.backends.aws.config import AwsConfig
from trainmaster.backends.aws.s3 import S3Store
from trainmaster.backends.base import BackendError, ConfigurationError

pytest_plugins = ["clouds.conftest_aws"]


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def store(aws_config):
    return S3Store(aws_config)


def test_a_large_file_goes_up_in_parts_with_progress(store, aws, tmp_path):
    path = tmp_path / "big.bin"
    data = os.urandom(12 * 2**20 + 123)  # three 5 MiB parts
    path.write_bytes(data)
    seen = []
    run(store.upload(path, "bundles/big.tar", lambda done, total: seen.append((done, total))))
    head = aws.client("s3").head_object(Bucket=BUCKET, Key="trainmaster/bundles/big.tar")
    assert head["ContentLength"] == len(data)
    assert head["ETag"].strip('"').endswith("-3")  # a multipart upload's ETag counts its parts
    assert seen[-1] == (len(data), len(data)) and all(t == len(data) for _, t in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and len(seen) >= 3
    assert hashlib.sha256(run(store.read("bundles/big.tar"))).digest() == hashlib.sha256(data).digest()


def test_a_small_file_goes_up_in_one_put(store, aws, tmp_path):
    path = tmp_path / "small.bin"
    path.write_bytes(b"hello")
    run(store.upload(path, "a/small"))
    head = aws.client("s3").head_object(Bucket=BUCKET, Key="trainmaster/a/small")
    assert "-" not in head["ETag"] and run(store.size("a/small")) == 5 and run(store.size("a/none")) is None


def test_reads_are_ranged(store, tmp_path):
    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * 4)
    run(store.upload(path, "log"))
    assert run(store.read("log", 10, 5)) == bytes(range(10, 15))
    assert run(store.read("log", 1020)) == bytes(range(252, 256))
    assert run(store.read("log", 1024)) == b"" and run(store.read("log", 2000, 10)) == b""
    assert run(store.read("missing")) is None


def test_stream_gives_the_object_from_an_offset_in_chunks(store, tmp_path, monkeypatch):
    from trainmaster.backends.aws import s3

    monkeypatch.setattr(s3, "CHUNK", 1000)
    path = tmp_path / "f"
    data = os.urandom(4500)
    path.write_bytes(data)
    run(store.upload(path, "out/f"))

    async def collect(offset):
        return [chunk async for chunk in store.stream("out/f", offset)]

    chunks = run(collect(700))
    assert b"".join(chunks) == data[700:] and [len(c) for c in chunks] == [1000, 1000, 1000, 800]
    with pytest.raises(BackendError, match="does not exist"):
        run(_drain(store.stream("out/none")))


async def _drain(stream):
    return [chunk async for chunk in stream]


def test_list_is_recursive_and_relative_to_the_prefix(store, aws, tmp_path):
    s3 = aws.client("s3")
    for key in ("attempts/a1/sync/outputs/x", "attempts/a1/sync/checkpoints/segments/00000001/w", "attempts/a2/y"):
        s3.put_object(Bucket=BUCKET, Key="trainmaster/" + key, Body=b"12345")
    s3.put_object(Bucket=BUCKET, Key="elsewhere/attempts/a1/z", Body=b"1")
    found = run(store.list("attempts/a1/"))
    assert sorted((o.key, o.size) for o in found) == [("attempts/a1/sync/checkpoints/segments/00000001/w", 5),
                                                      ("attempts/a1/sync/outputs/x", 5)]


def test_list_pages_through_more_than_a_thousand_keys(store, aws):
    s3 = aws.client("s3")
    for i in range(1003):
        s3.put_object(Bucket=BUCKET, Key=f"trainmaster/many/{i:05d}", Body=b"")
    assert len(run(store.list("many/"))) == 1003


def test_copy_is_server_side(store, aws, tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"checkpoint bytes")
    run(store.upload(path, "attempts/a1/sync/checkpoints/w"))
    run(store.copy("attempts/a1/sync/checkpoints/w", "attempts/a2/sync/checkpoints/w"))
    body = aws.client("s3").get_object(Bucket=BUCKET, Key="trainmaster/attempts/a2/sync/checkpoints/w")["Body"].read()
    assert body == b"checkpoint bytes"
    with pytest.raises(BackendError, match="source does not exist"):
        run(store.copy("attempts/a1/none", "attempts/a2/none"))


def test_uri_names_bucket_and_prefix(aws_config):
    assert S3Store(aws_config).uri("bundles/x.tar") == f"s3://{BUCKET}/trainmaster/bundles/x.tar"
    assert S3Store(aws_config.model_copy(update={"s3_prefix": ""})).uri("k") == f"s3://{BUCKET}/k"
    with pytest.raises(BackendError, match="aws.s3_bucket is not set"):
        S3Store(AwsConfig())


def test_a_missing_bucket_is_a_configuration_error_naming_it(aws_config, tmp_path):
    """The set-up's fault, not the job's: the broker blocks the backend for the job (never a loop over its offers)."""
    store = S3Store(aws_config.model_copy(update={"s3_bucket": "no-such-bucket"}))
    with pytest.raises(ConfigurationError, match="NoSuchBucket"):
        run(store.list(""))


def test_the_fake_refuses_a_key_s3_refuses(store, tmp_path):
    """moto checks every S3 request's bucket and key against S3's rules: a 1,025-byte key is refused as S3 does."""
    path = tmp_path / "f"
    path.write_bytes(b"x")
    with checked.expected() as refused:
        with pytest.raises(BackendError, match="KeyTooLongError"):
            run(store.upload(path, "k" * 1025))
    assert refused and "1-1024" in refused[0]


def test_missing_credentials_are_named(aws_config, monkeypatch):
    from trainmaster.backends.aws import sdk

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key)
    sdk.session.cache_clear()
    sdk.client.cache_clear()
    with pytest.raises(ConfigurationError, match="Unable to locate credentials"):
        run(S3Store(aws_config).list(""))
