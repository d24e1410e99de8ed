"""The shipped catalogs price the managed training services: the instance each service's API takes, and for
Vertex AI the accelerator beside the machine type; CPU-only jobs get CPU rows."""

from __future__ import annotations

from datetime import date

import pytest

from trainmaster.backends.base import OfferConstraints, OfferRequest
from trainmaster.backends.catalog import catalog_offers, load_catalog
from trainmaster.backends.catalog.accelerators import vertex_accelerator
from trainmaster.jobs.spec import JobSpec

FRESH = date(2025, 7, 2)


def offers(cloud: str, **resources):
    job = JobSpec(name="t", entrypoint="python t.py", resources=resources)
    request = OfferRequest(spec=job, constraints=OfferConstraints(spot_allowed=True))
    return catalog_offers(cloud, request, catalog=load_catalog(cloud, today=FRESH)).offers


def test_vertex_offers_carry_the_accelerator_beside_the_machine_type():
    t4 = {o.instance: o for o in offers("gcp", gpus=1, gpu_types=["T4"])}
    assert t4["n1-standard-8"].detail["accelerator"] == {"type": "NVIDIA_TESLA_T4", "count": 1}
    a100 = {o.instance: o for o in offers("gcp", gpus=8, gpu_types=["A100"])}
    assert a100["a2-highgpu-8g"].detail["accelerator"] == {"type": "NVIDIA_TESLA_A100", "count": 8}
    assert a100["a2-ultragpu-8g"].detail["accelerator"] == {"type": "NVIDIA_A100_80GB", "count": 8}
    assert all("accelerator" not in o.detail for o in offers("gcp", gpus=0) if not o.gpu_count)
    assert all("accelerator" not in o.detail for cloud in ("aws", "azure") for o in offers(cloud, gpus=1))


def test_an_accelerator_vertex_does_not_offer_is_refused():
    with pytest.raises(ValueError, match="Vertex AI offers no A10G"):
        vertex_accelerator("A10G", 24)


@pytest.mark.parametrize("cloud, cheapest", [("aws", "ml.m5.large"), ("gcp", "n1-standard-4"),
                                             ("azure", "Standard_D4s_v3")])
def test_a_cpu_job_is_offered_cpu_instances(cloud, cheapest):
    found = [o for o in offers(cloud, gpus=0, cpus=2) if not o.spot]
    assert min(found, key=lambda o: o.price_per_hour_micro_usd).instance == cheapest
    assert any(o.gpu_count == 0 for o in found)


def test_sagemaker_prices_carry_its_premium_over_ec2():
    g5 = next(o for o in offers("aws", gpus=1, gpu_types=["A10G"]) if o.instance == "ml.g5.xlarge" and not o.spot)
    assert g5.price_per_hour_micro_usd == 1_408_000 and g5.region in ("us-east-1", "us-west-2")
