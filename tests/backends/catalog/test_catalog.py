"""Price catalogs: shipped files, user overrides, staleness, offers, GPU names and transfer prices."""

from __future__ import annotations

import os
import time
import warnings
from datetime import date, datetime, timedelta, timezone

import pytest

from trainmaster.backends.base import OfferConstraints, OfferRequest
from trainmaster.backends.catalog import (
    CLOUDS, StaleCatalogWarning, canonical_gpu, catalog_offers, gpu_matches, load_catalog, throughput,
)
from trainmaster.backends.catalog.transfer import egress_micro_usd, source_cloud
from trainmaster.jobs.spec import JobSpec
from trainmaster.jobs.yamlfile import FileError

SHIPPED_DATE = date(2025, 7, 1)
FRESH = SHIPPED_DATE + timedelta(days=10)
HEADER = ("cloud,instance,region,gpu_type,gpu_count,gpu_memory_gb,vcpus,memory_gb,"
          "on_demand_usd_per_hour,spot_usd_per_hour\n")


def spec(**resources) -> JobSpec:
    return JobSpec(name="t", entrypoint="python t.py", resources=resources)


def request(job: JobSpec, *, spot_allowed: bool) -> OfferRequest:
    return OfferRequest(spec=job, constraints=OfferConstraints(spot_allowed=spot_allowed))


def quiet(cloud: str, **kw):
    return load_catalog(cloud, today=FRESH, **kw)


@pytest.mark.parametrize("cloud, instances, cpu_only", [
    ("aws", ["ml.p3.2xlarge", "ml.p4d.24xlarge", "ml.p5.48xlarge", "ml.g4dn.xlarge"]
     + [f"ml.g5.{s}xlarge" for s in ("", "2", "4", "8", "12", "16", "24", "48")], ["ml.m5.large", "ml.m5.xlarge"]),
    ("gcp", ["a2-highgpu-1g", "a2-highgpu-2g", "a2-highgpu-4g", "a2-highgpu-8g", "a3-highgpu-8g", "g2-standard-4",
             "n1-standard-8"], ["n1-standard-4"]),
    ("azure", ["Standard_NC24ads_A100_v4", "Standard_ND96asr_v4", "Standard_ND96isr_H100_v5"], ["Standard_D4s_v3"]),
])
def test_shipped_catalogs_hold_the_managed_services_instances(cloud, instances, cpu_only):
    """The instance names the managed services take (SageMaker's ml.*, Vertex machine types, Azure ML VM sizes),
    GPU and CPU-only, each with a spot (managed spot, Spot VM, low-priority) price below on-demand."""
    catalog = quiet(cloud)
    rows = {r.instance: r for r in catalog.rows}
    assert set(instances) | set(cpu_only) <= set(rows)
    assert all(rows[name].gpu_count == 0 and rows[name].gpu_type is None for name in cpu_only)
    assert [s.date for s in catalog.sources] == [SHIPPED_DATE]
    for row in catalog.rows:
        assert isinstance(row.on_demand_micro_usd, int) and row.on_demand_micro_usd > 0
        assert row.spot_micro_usd is not None and 0 < row.spot_micro_usd < row.on_demand_micro_usd
        assert (row.gpu_count >= 1) == bool(row.gpu_type) == bool(row.gpu_memory_gb)
    if cloud == "aws":
        assert all(name.startswith("ml.") for name in rows)


def test_prices_are_exact_micro_usd():
    rows = {(r.instance, r.region): r for r in quiet("gcp").rows}
    assert rows["n1-standard-8", "us-central1"].on_demand_micro_usd == 436_998 + 402_500  # machine + one T4
    aws = {(r.instance, r.region): r for r in quiet("aws").rows}
    assert aws["ml.g5.xlarge", "us-east-1"].on_demand_micro_usd == 1_408_000  # SageMaker's price, not EC2's 1.006
    assert aws["ml.p3.2xlarge", "us-east-1"].spot_micro_usd == 1_147_500  # 70 % off, as the README states


def test_override_replaces_same_key_and_adds_rows(tmp_path):
    (tmp_path / "aws.csv").write_text(
        "# date: 2026-11-01\n" + HEADER
        + "aws,ml.p3.2xlarge,us-east-1,V100,1,16,8,61,2.50,\n"
        + "aws,p9.mine,us-east-1,H100,8,80,192,2048,40,20\n"
    )
    catalog = load_catalog("aws", override_dir=tmp_path, today=date(2026, 11, 2), max_age_days=1000)
    rows = {(r.instance, r.region): r for r in catalog.rows}
    mine = rows["ml.p3.2xlarge", "us-east-1"]
    assert (mine.on_demand_micro_usd, mine.spot_micro_usd, mine.date) == (2_500_000, None, date(2026, 11, 1))
    assert rows["ml.p3.2xlarge", "us-west-2"].on_demand_micro_usd == 3_825_000  # other regions untouched
    assert rows["p9.mine", "us-east-1"].gpu_count == 8
    assert len(catalog.rows) == len(quiet("aws").rows) + 1
    assert [s.path for s in catalog.sources][-1] == str(tmp_path / "aws.csv")


def test_override_without_date_is_dated_by_its_mtime(tmp_path):
    path = tmp_path / "gcp.csv"
    path.write_text(HEADER + "gcp,x,us-central1,L4,1,24,4,16,1,\n")
    two_years_ago = time.time() - 730 * 86400
    os.utime(path, (two_years_ago, two_years_ago))
    with pytest.warns(StaleCatalogWarning, match=r"gcp.csv: prices dated .* are 730 days old"):
        catalog = load_catalog("gcp", override_dir=tmp_path, max_age_days=600, today=datetime.now(timezone.utc).date())
    assert catalog.sources[-1].date == datetime.fromtimestamp(two_years_ago, timezone.utc).date()


def test_bad_override_cells_are_reported_with_line_and_column(tmp_path):
    (tmp_path / "azure.csv").write_text(
        "# date: 2026-01-01\n" + HEADER
        + "azure,a,eastus,A100,one,80,24,220,3.6,\n"
        + "aws,b,eastus,A100,1,80,24,220,3.6,\n"
        + "azure,c,eastus,A100,1,80,24,220,$x,\n"
        + "azure,d,eastus,A100,1,80,24\n"
    )
    with pytest.raises(FileError) as err:
        load_catalog("azure", override_dir=tmp_path, today=date(2026, 1, 2))
    path = tmp_path / "azure.csv"
    assert err.value.problems == [
        f"{path}:3: gpu_count: expected a whole number, got 'one'",
        f"{path}:4: cloud: this is the azure catalog, but the row says 'aws'",
        f"{path}:5: on_demand_usd_per_hour: expected an amount in USD such as 12.50, got '$x'",
        f"{path}:6: expected 10 values, found 7",
    ]


def test_bad_header_and_date(tmp_path):
    (tmp_path / "aws.csv").write_text("# date: 2026-01-01\ncloud,instance,regoin\n")
    with pytest.raises(FileError, match=r"aws.csv:2: regoin: unknown column"):
        load_catalog("aws", override_dir=tmp_path)
    (tmp_path / "aws.csv").write_text("# date: yesterday\n" + HEADER)
    with pytest.raises(FileError, match=r"aws.csv:1: date: expected YYYY-MM-DD"):
        load_catalog("aws", override_dir=tmp_path)
    with pytest.raises(ValueError, match="catalogs exist for aws, gcp, azure"):
        load_catalog("lambda")


def test_stale_catalog_warns_once_per_file_and_age_is_configurable():
    with pytest.warns(StaleCatalogWarning) as caught:
        load_catalog("aws", today=SHIPPED_DATE + timedelta(days=91))
    assert [str(w.message).split("backends/catalog/")[-1] for w in caught] == [
        "aws.csv: prices dated 2025-07-01 are 91 days old (more than 90); they may be wrong. "
        "Put current prices in an override file."
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_catalog("aws", today=SHIPPED_DATE + timedelta(days=90))
        load_catalog("aws", today=SHIPPED_DATE + timedelta(days=400), max_age_days=400)


def test_catalog_offers_fit_the_spec():
    offers = catalog_offers("aws", request(spec(gpus=8, gpu_types=["A100"], min_vram_gb=80), spot_allowed=True), catalog=quiet("aws"))
    assert {(o.instance, o.spot) for o in offers.offers} == {("ml.p4de.24xlarge", False), ("ml.p4de.24xlarge", True)}
    assert {o.region for o in offers.offers} == {"us-east-1", "us-west-2"}
    for offer in offers.offers:
        assert offer.trusted and offer.gpu_count == 8 and offer.gpu_memory_mb == 80 * 1024
        assert offer.detail["price_source"] == "catalog" and offer.detail["catalog_date"] == "2025-07-01"


def test_catalog_offers_without_spot_and_multi_node():
    offers = catalog_offers("gcp", request(spec(gpus=1, gpu_types=["L4"], nodes=2), spot_allowed=False), catalog=quiet("gcp"))
    assert offers.offers and not any(o.spot for o in offers.offers)
    assert all(o.nodes == 2 and o.gpu_type == "L4" for o in offers.offers)


def test_catalog_offers_explain_when_nothing_fits():
    offers = catalog_offers("azure", request(spec(gpus=16), spot_allowed=True), catalog=quiet("azure"))
    assert offers.offers == []
    assert offers.reasons == [f"no azure instance in the catalog fits: {len(quiet('azure').rows)} with fewer than 16 GPU(s)"]


def test_every_cloud_has_a_catalog():
    assert CLOUDS == ("aws", "gcp", "azure")


@pytest.mark.parametrize("name, canonical, speed", [
    ("NVIDIA A100-SXM4-80GB", "A100", 1.0),
    ("NVIDIA H100 80GB HBM3", "H100", 3.0),
    ("NVIDIA L4", "L4", 0.35),
    ("NVIDIA A10G", "A10G", 0.3),
    ("A10", "A10", 0.35),
    ("NVIDIA GeForce RTX 4090", "RTX 4090", 0.75),
    ("Tesla V100-SXM2-16GB", "V100", 0.45),
    ("NVIDIA Quadro Mystery", "QUADRO MYSTERY", None),
])
def test_gpu_names_and_throughput(name, canonical, speed):
    assert canonical_gpu(name) == canonical
    assert throughput(name) == speed


def test_gpu_matching_does_not_confuse_a10_and_a100():
    assert gpu_matches("NVIDIA A100-SXM4-40GB", ["a100"])
    assert not gpu_matches("A100", ["A10"]) and not gpu_matches("A10G", ["A10"])
    assert gpu_matches("anything", []) and not gpu_matches(None, ["A100"])


def test_transfer_prices():
    assert source_cloud("s3://bucket/x") == "aws" and source_cloud("gs://b") == "gcp" and source_cloud("data/x") is None
    assert egress_micro_usd("aws", "aws", 10**12) == 0
    assert egress_micro_usd(None, "gcp", 10**12) == 0
    assert egress_micro_usd("aws", "bittensor", 10**9) == 90_000
    assert egress_micro_usd("gcp", "aws", 1) == 1  # rounded up to the micro-dollar
