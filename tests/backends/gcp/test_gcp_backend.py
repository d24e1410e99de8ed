"""GcpBackend (backends/gcp/backend.py) over the real SDK clients and the local servers: the attempt's layout
Vertex imposes, a bundle sent once, a second submit finding the job it started, readiness through the registry."""

from __future__ import annotations

import asyncio

import pytest

from trainmaster.backends.base import AttemptContext, Offer
from trainmaster.backends.gcp.backend import GcpBackend
from trainmaster.backends.gcp.config import GcpConfig
from trainmaster.jobs import launch_plan as plan
from trainmaster.jobs.spec import JobSpec

pytest_plugins = ["clouds.conftest_gcp"]
SHA = "b" * 64


def offer(**kw) -> Offer:
    return Offer(backend="gcp", instance="n1-standard-4", region="us-central1", price_per_hour_micro_usd=218_499, **kw)


def ctx(attempt: str) -> AttemptContext:
    return AttemptContext(job_id="job1", attempt_id=attempt, bundle_sha256=SHA, seed=7, workdir="/nonexistent")


@pytest.fixture
def backend(gcp):
    return GcpBackend(GcpConfig(**gcp.config(gcp.credentials)))


def test_submit_sends_the_bundle_once_and_starts_one_job_per_attempt(backend, gcp, tmp_path):
    bundle = tmp_path / "bundle.tar"
    bundle.write_bytes(b"t" * 4096)
    spec = JobSpec.model_validate({"name": "t", "entrypoint": "python train.py"})
    sent = []
    backend.progress = lambda done, total: sent.append(done)
    handle = asyncio.run(backend.submit(bundle, spec, offer(), ctx("A1")))
    assert 4096 in sent  # the bundle's bar (then the runtime pack's)
    sent.clear()
    restarted = GcpBackend(backend.config)  # after a crash
    restarted.progress = backend.progress
    again = asyncio.run(restarted.submit(bundle, spec, offer(), ctx("A1")))
    asyncio.run(backend.submit(bundle, spec, offer(spot=True), ctx("A2")))
    pack = handle.data["runtime_bytes"]
    assert 0 < len(sent) <= 4 and set(sent) <= {4096, pack}  # content-addressed: already there, not sent again
    assert handle == again and handle.data["sync"] == "attempts/A1/checkpoints/"
    assert len(gcp.vertex.jobs) == 2 and gcp.vertex.calls("create") == 2
    blobs = {b.name: b.size for b in gcp.storage_client().list_blobs("tm-staging")}
    runtime = [name for name in blobs if name.startswith("runs/runtime/")]
    assert blobs[f"runs/bundles/{SHA}.tar"] == 4096 and len(runtime) == 1 and blobs[runtime[0]] == pack
    for attempt in ("A1", "A2"):
        assert {n.rsplit("/", 1)[1] for n in blobs if n.startswith(f"runs/attempts/{attempt}/input/")} == {
            "boot.py", "launch.json", "runtime.zip"}
    job = gcp.vertex.by_display_name(handle.data["name"])
    launch = plan.LaunchPlan.model_validate_json(
        gcp.storage_client().bucket("tm-staging").blob("runs/attempts/A1/input/launch.json").download_as_bytes())
    assert launch.service == "vertex" and launch.bundle == f"gs://tm-staging/runs/bundles/{SHA}.tar"
    container = job.job_spec.worker_pool_specs[0].container_spec
    assert list(container.command) == ["python3", "/gcs/tm-staging/runs/attempts/A1/input/boot.py"]
    assert not container.env  # the plan is a file of the input
    assert job.job_spec.base_output_directory.output_uri_prefix == "gs://tm-staging/runs/attempts/A1/"
    assert container.image_uri == gcp.config(gcp.credentials)["image"]


def test_offers_are_the_catalogs_in_the_configured_region(gcp):
    from trainmaster.backends.base import OfferRequest

    request = OfferRequest(spec=JobSpec.model_validate({"name": "t", "entrypoint": "python t.py"}))
    found = asyncio.run(GcpBackend(GcpConfig(location="asia-northeast1")).offers(request))
    assert not found.offers and "asia-northeast1" in found.reasons[0]  # no catalog row there (refresh --region adds)
    europe = asyncio.run(GcpBackend(GcpConfig(location="europe-west4")).offers(request))
    assert europe.offers and {o.region for o in europe.offers} == {"europe-west4"}
    here = asyncio.run(GcpBackend(GcpConfig()).offers(request))
    assert here.offers and {o.region for o in here.offers} == {"us-central1"}


def test_readiness_through_the_registry(gcp):
    from trainmaster.backends.registry import entry

    reasons, found = entry("gcp").readiness(GcpConfig(**gcp.config(gcp.credentials)))
    assert reasons == [] and found[0].startswith("credentials: credentials_file")
