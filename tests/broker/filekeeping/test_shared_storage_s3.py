"""Shared storage on an S3 prefix (TRAINMASTER_SHARED_STORAGE=s3://bucket/prefix) through the real boto3 client
against moto on 127.0.0.1 (backends.yaml's `aws:` section points at it): end to end through the CLI, a job's bundle
and outputs land under the prefix, `status` names the URL, a second host restores identical files, and objects
altered there are refused with the location; a bundle the cache lacks is fetched, its sha256 checked."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest

from clouds.aws_server import BUCKET, REGION
from shared_support import TWO_OUTPUTS, cli, files_under, submitted

pytest_plugins = ["clouds.conftest_aws"]

STORAGE = f"s3://{BUCKET}/team/tm"


@pytest.fixture
def s3_home(aws, tm_home):
    """A home whose backends.yaml sends S3 calls to moto (fake keys: nothing can reach AWS)."""
    config = tm_home / "config"
    config.mkdir(parents=True)
    (config / "backends.yaml").write_text(f"aws:\n  endpoint_url: {aws.endpoint}\n  region: {REGION}\n")
    return tm_home


def _objects(aws, prefix: str) -> dict[str, bytes]:
    s3 = aws.client("s3")
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return {o["Key"][len(prefix):]: s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listed}


def test_a_job_shared_on_s3_is_restored_on_another_host(aws, s3_home, job_factory, tmp_path):
    job = submitted(job_factory(TWO_OUTPUTS), s3_home, STORAGE)
    assert job["state"] == "accepted", job["reason"]
    bundle = _objects(aws, "team/tm/bundles/")
    assert list(bundle) == [f"{job['bundle_sha256']}.tar"]
    assert hashlib.sha256(bundle[f"{job['bundle_sha256']}.tar"]).hexdigest() == job["bundle_sha256"]
    kept = files_under(s3_home / "jobs" / job["id"] / "outputs")
    assert _objects(aws, f"team/tm/jobs/{job['id']}/outputs/") == kept and len(kept) == 2
    manifest = json.loads(_objects(aws, f"team/tm/jobs/{job['id']}/manifest.json")[""])
    assert sorted(f["path"] for f in manifest["files"]) == sorted(kept)
    assert job["outputs_url"] == f"{STORAGE}/jobs/{job['id']}/outputs/"

    for path in sorted((s3_home / "jobs" / job["id"] / "outputs").rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    dest = tmp_path / "restored"
    got = cli("outputs", job["id"], "--dest", str(dest), home=s3_home, storage=None)
    assert got.returncode == 0, got.stderr
    assert files_under(dest) == kept

    aws.client("s3").put_object(Bucket=BUCKET, Key=f"team/tm/jobs/{job['id']}/outputs/result.txt", Body=b"no")
    refused = cli("outputs", job["id"], "--dest", str(tmp_path / "again"), home=s3_home, storage=None)
    assert refused.returncode == 2
    assert (f"{STORAGE}/jobs/{job['id']}/outputs/result.txt is not the output that was accepted"
            in " ".join(refused.stderr.split()))


def test_a_bundle_the_cache_lacks_is_fetched_from_s3_checked(aws, s3_home, monkeypatch, tmp_path):
    from trainmaster.broker import paths
    from trainmaster.broker.filekeeping import shared_bundles
    from trainmaster.broker.filekeeping.shared_storage import SharedStorageError

    monkeypatch.setenv("TRAINMASTER_SHARED_STORAGE", STORAGE)
    data = b"a bundle's bytes" * 1000
    sha = hashlib.sha256(data).hexdigest()
    paths.bundles_dir().mkdir(parents=True)
    shared_bundles.local(sha).write_bytes(data)
    asyncio.run(shared_bundles.publish(sha))
    assert _objects(aws, "team/tm/bundles/") == {f"{sha}.tar": data}

    shared_bundles.local(sha).unlink()
    assert asyncio.run(shared_bundles.fetched(sha)).read_bytes() == data

    shared_bundles.local(sha).unlink()
    aws.client("s3").put_object(Bucket=BUCKET, Key=f"team/tm/bundles/{sha}.tar", Body=data[:-1] + b"X")
    with pytest.raises(SharedStorageError, match=f"{STORAGE}/bundles/{sha}.tar is not the bundle it names"):
        asyncio.run(shared_bundles.fetched(sha))
    assert not shared_bundles.local(sha).exists()
    missing = "0" * 64
    with pytest.raises(SharedStorageError, match=f"neither in .* nor at {STORAGE}/bundles/{missing}.tar"):
        asyncio.run(shared_bundles.fetched(missing))
