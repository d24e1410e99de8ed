"""Bundle upload and output download through each cloud's object store (#18), against the local stand-ins the
tests use (moto's S3, gcp-storage-emulator, Azurite), vs a raw loopback copy of the same bytes to the same server.

For each store: `transfer.upload` → the store's `upload` (multipart / resumable / blocks, with the progress
callback), and `transfer.download` of the store's `stream` (hashed as it arrives, resumable) — the path a
bundle and an attempt's outputs take; beside each, one plain HTTP PUT and one streamed GET of the same file to the
same server with the standard library (a presigned S3 URL, the emulator's media upload and download, an Azurite SAS URL): what
the server and the loopback allow. Figures: MiB/s of ours and of raw, and ours/raw (≥ 0.5 means the store code
costs at most half of what a bare copy takes; the servers themselves, in Python or node, are the bottleneck).

Run: python tests/benchmarks/bench_cloud_transfer.py   (256 MiB per store; smoke: 8 MiB)
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(Path(__file__).parent)]
from _common import print_figures  # noqa: E402

MiB = 2**20


def _raw_put(url: str, path: Path, headers: dict[str, str] | None = None, method: str = "PUT") -> float:
    data = path.read_bytes()
    started = time.perf_counter()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/octet-stream", **(headers or {})})
    with urllib.request.urlopen(request, timeout=600) as answer:
        answer.read()
    return time.perf_counter() - started


def _raw_get(url: str, dest: Path) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as answer, open(dest, "wb") as out:
        while chunk := answer.read(4 * MiB):
            out.write(chunk)
    return time.perf_counter() - started


async def _ours(store, path: Path, key: str, dest: Path) -> tuple[float, float]:
    from trainmaster.backends import transfer

    size, digest = path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest()
    started = time.perf_counter()
    sent = await transfer.upload(path, stored_size=lambda: store.size(key),
                                 put=lambda p, progress: store.upload(p, key, progress), progress=lambda *_: None)
    up = time.perf_counter() - started
    assert sent, "the key was already there"
    started = time.perf_counter()
    await transfer.download(lambda offset: store.stream(key, offset), dest, size=size, sha256=digest)
    return up, time.perf_counter() - started


def _aws(path: Path, work: Path) -> tuple[tuple[float, float], tuple[float, float]]:
    from clouds.aws_server import BUCKET, REGION, MotoAws
    from clouds.conftest_aws import FAKE_ENV

    os.environ.update(FAKE_ENV)
    moto = MotoAws()
    try:
        moto.client("s3").create_bucket(Bucket=BUCKET)
        from trainmaster.backends.aws.config import AwsConfig
        from trainmaster.backends.aws.s3 import S3Store

        store = S3Store(AwsConfig(endpoint_url=moto.endpoint, region=REGION, s3_bucket=BUCKET))
        ours = asyncio.run(_ours(store, path, "bench/bundle.tar", work / "aws.out"))
        s3 = moto.client("s3")
        put = s3.generate_presigned_url("put_object", Params={"Bucket": BUCKET, "Key": "raw/x"}, ExpiresIn=600)
        up = _raw_put(put, path)
        get = s3.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": "raw/x"}, ExpiresIn=600)
        return ours, (up, _raw_get(get, work / "aws.raw"))
    finally:
        moto.stop()


def _azure(path: Path, work: Path) -> tuple[tuple[float, float], tuple[float, float]]:
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    from clouds.azure_server import ACCOUNT, KEY, Azurite

    azurite = Azurite(work)
    os.environ["AZURE_STORAGE_CONNECTION_STRING"] = azurite.connection_string
    try:
        from trainmaster.backends.azure.blob import BlobStore
        from trainmaster.backends.azure.config import AzureConfig

        container = f"c{uuid.uuid4().hex[:12]}"
        store = BlobStore(AzureConfig(resource_group="rg", workspace="ws", container=container))
        ours = asyncio.run(_ours(store, path, "bench/bundle.tar", work / "azure.out"))
        sas = generate_container_sas(ACCOUNT, container, account_key=KEY, expiry=time.time() + 600,
                                     permission=ContainerSasPermissions(read=True, write=True, create=True))
        url = f"{azurite.url}/{container}/raw-x?{sas}"
        up = _raw_put(url, path, {"x-ms-blob-type": "BlockBlob"})
        return ours, (up, _raw_get(url, work / "azure.raw"))
    finally:
        azurite.stop()


def _gcp(path: Path, work: Path) -> tuple[tuple[float, float], tuple[float, float]]:
    import urllib.parse

    from clouds import gcp_server

    servers = gcp_server.start()
    os.environ.update(STORAGE_EMULATOR_HOST=servers.gcs_url, NO_GCE_CHECK="True")
    try:
        servers.reset()
        from trainmaster.backends.gcp.config import GcpConfig
        from trainmaster.backends.gcp.gcs import GcsStore

        config = GcpConfig(**servers.config(servers.credentials_file(work)))
        ours = asyncio.run(_ours(GcsStore(config), path, "bench/bundle.tar", work / "gcp.out"))
        base, name = servers.gcs_url, urllib.parse.quote("raw/x", safe="")
        up = _raw_put(f"{base}/upload/storage/v1/b/{gcp_server.BUCKET}/o?uploadType=media&name={name}", path,
                      method="POST")
        return ours, (up, _raw_get(f"{base}/download/storage/v1/b/{gcp_server.BUCKET}/o/{name}?alt=media",
                                   work / "gcp.raw"))
    finally:
        servers.stop()


CLOUDS = {"aws": _aws, "gcp": _gcp, "azure": _azure}


def run(smoke: bool = False) -> dict[str, float]:
    size = (8 if smoke else 256) * MiB
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-cloud-transfer-") as tmp:
        work = Path(tmp)
        path = work / "bundle.tar"
        with open(path, "wb") as f:
            for _ in range(size // MiB):
                f.write(os.urandom(MiB))
        for cloud, measure in CLOUDS.items():
            (up, down), (raw_up, raw_down) = measure(path, work)
            mib = size / MiB
            figures.update({
                f"{cloud} upload MiB/s": mib / up, f"{cloud} raw PUT MiB/s": mib / raw_up,
                f"{cloud} upload / raw": raw_up / up,
                f"{cloud} download MiB/s": mib / down, f"{cloud} raw GET MiB/s": mib / raw_down,
                f"{cloud} download / raw": raw_down / down,
            })
    print_figures(f"cloud object stores, {size // MiB} MiB each way (local stand-ins on 127.0.0.1)", figures)
    return figures


if __name__ == "__main__":
    run(smoke="--smoke" in sys.argv)
