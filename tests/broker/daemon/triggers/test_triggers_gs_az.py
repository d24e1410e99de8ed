"""Data thresholds on `gs://` and `az://` prefixes, as tests/broker/daemon/triggers/test_triggers_sources.py does `s3://` on moto: listed
through the GCS store on gcp-storage-emulator and the Blob store on Azurite, firing once per threshold of new
objects since the last accepted run; a bucket or container that is not there is a problem, never a crash."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timezone

import pytest

from clouds.gcp_server import BUCKET
from trainmaster.broker.daemon.triggers.engine import TriggerEngine
from trainmaster.broker.daemon.triggers.model import Data
from trigger_support import Jobs, trigger

pytest_plugins = ["clouds.conftest_gcp", "clouds.conftest_azure"]

NOW = datetime(2024, 1, 1, tzinfo=timezone.utc).timestamp()


def tick(eng, now=NOW):
    return asyncio.run(eng.tick(now))


@pytest.fixture
def gcs(gcp):
    """(put(name), {"gcp": config}, the bucket) on the emulator."""
    from trainmaster.backends.gcp.config import GcpConfig

    bucket = gcp.storage_client().bucket(BUCKET)
    return (lambda name: bucket.blob(name).upload_from_string(b"x")), {"gcp": GcpConfig(**gcp.config(gcp.credentials))}, BUCKET


@pytest.fixture
def blob(azure, azure_config):
    """(put(name), {"azure": config}, the container) on Azurite, the container made."""
    from azure.storage.blob import BlobServiceClient

    service = BlobServiceClient.from_connection_string(azure.env["AZURE_STORAGE_CONNECTION_STRING"])
    container = service.create_container(azure_config.container)
    return (lambda name: container.upload_blob(name, b"x")), {"azure": azure_config}, azure_config.container


@pytest.fixture(params=["gs", "az"])
def cloud(request):
    """(scheme, put, configs, bucket or container) of one cloud's store on its local server."""
    put, configs, root = request.getfixturevalue({"gs": "gcs", "az": "blob"}[request.param])
    return request.param, put, configs, root


def test_a_prefix_fires_at_its_threshold_of_new_objects(cloud, tmp_path):
    scheme, put, configs, root = cloud
    for i in range(3):
        put(f"incoming/batch-{i}.parquet")
    put("elsewhere/not-counted")
    put("incoming-not-a-folder/not-counted")
    jobs = Jobs(tmp_path / "state.db")
    eng = TriggerEngine(tmp_path / "state.db", [trigger(data=Data(prefix=f"{scheme}://{root}/incoming", min_new=4))],
                        jobs.submit, configs=configs)
    assert tick(eng) == [] and not eng.problems
    put("incoming/sub/batch-3.parquet")
    [fired] = tick(eng, NOW + 10)
    assert "data: 4 new" in fired.reason
    jobs.end(fired.job_id)
    put("incoming/batch-4.parquet")
    assert tick(eng, NOW + 20) == []  # one new since the accepted run
    assert jobs.store.events(fired.job_id)[0].detail["origin"]["trigger_key"] == fired.key


def test_a_prefix_at_the_root_counts_every_object(cloud, tmp_path):
    scheme, put, configs, root = cloud
    put("a")
    put("b/c")
    jobs = Jobs(tmp_path / "state.db")
    eng = TriggerEngine(tmp_path / "state.db", [trigger(data=Data(prefix=f"{scheme}://{root}", min_new=2))],
                        jobs.submit, configs=configs)
    [fired] = tick(eng)
    assert "data: 2 new" in fired.reason


@pytest.mark.parametrize("scheme, fixture", [("gs", "gcp"), ("az", "azure")])
def test_a_missing_bucket_or_container_is_a_problem_not_a_crash(scheme, fixture, request, tmp_path):
    request.getfixturevalue(fixture)
    configs = ({"gcp": request.getfixturevalue("gcs")[1]["gcp"]} if scheme == "gs"
               else {"azure": request.getfixturevalue("azure_config")})
    missing = f"no-such-{uuid.uuid4().hex[:8]}"
    jobs = Jobs(tmp_path / "state.db")
    eng = TriggerEngine(tmp_path / "state.db", [trigger(data=Data(prefix=f"{scheme}://{missing}/x", min_new=1))],
                        jobs.submit, configs=configs)
    assert tick(eng) == []
    assert f"cannot list {scheme}://{missing}/x" in eng.problems["t"], eng.problems
