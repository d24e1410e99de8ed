"""`trainmaster catalog refresh` against local stand-ins of the three price APIs (tests/price_api_fakes.py),
replaying recorded multi-page answers: the refreshed layer is written, offers use it, failures keep it as it was."""

from __future__ import annotations

import csv
import json
from datetime import datetime, timezone

import pytest

from cli_run import tm
from price_api_fakes import FakeAwsPricing, FakeCloudBilling, FakeRetailPrices
from served_app import ServedApp


@pytest.fixture(scope="module")
def apis():
    fakes = {"aws": FakeAwsPricing(), "gcp": FakeCloudBilling(), "azure": FakeRetailPrices()}
    served = {cloud: ServedApp(fake.app) for cloud, fake in fakes.items()}
    yield fakes, {
        "TRAINMASTER_AWS_PRICING_ENDPOINT": served["aws"].url, "TRAINMASTER_GCP_BILLING_ENDPOINT": served["gcp"].url,
        "TRAINMASTER_AZURE_PRICES_ENDPOINT": served["azure"].url, "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": "/nonexistent",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "TRAINMASTER_GCP_API_KEY": "test-key",
    }
    for app in served.values():
        app.stop()


@pytest.fixture
def fakes(apis):
    for fake in apis[0].values():
        fake.faults.clear()
        fake.requests.clear()
    return apis[0]


@pytest.fixture
def refresh(apis, tm_home):
    def run(*args: str):
        return tm("catalog", "refresh", *args, home=tm_home, extra_env=apis[1])
    return run


def rows(path) -> dict[tuple[str, str], dict]:
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    return {(r["instance"], r["region"]): r for r in csv.DictReader(lines)}


def test_refresh_writes_the_prices_each_api_gives_for_the_catalogs_rows(refresh, fakes, tm_home):
    done = refresh("--json")
    assert done.returncode == 0, done.stderr
    outcome = {o["cloud"]: o for o in json.loads(done.stdout)}
    assert all(o["ok"] for o in outcome.values())
    aws = rows(tm_home / "catalogs" / "aws.csv")
    # training usage type only (not Host/Notebk/Train-Spot), over two pages; spot keeps the shipped 65 % discount
    assert aws["ml.g5.xlarge", "us-east-1"] == {**aws["ml.g5.xlarge", "us-east-1"], "on_demand_usd_per_hour": "1.52",
                                                "spot_usd_per_hour": "0.532", "gpu_type": "A10G", "vcpus": "4"}
    assert aws["ml.m5.large", "us-east-1"]["on_demand_usd_per_hour"] == "0.115"  # the free dimension is ignored
    assert set(aws) == {("ml.g5.xlarge", "us-east-1"), ("ml.g5.xlarge", "us-west-2"), ("ml.m5.large", "us-east-1"),
                        ("ml.p4d.24xlarge", "us-east-1")}  # ml.trn1.2xlarge is not a catalog row
    assert outcome["aws"]["priced"] == 4 and outcome["aws"]["unchanged"] == 1
    assert {"instance": "ml.p4d.24xlarge", "region": "us-east-1", "before_micro_usd": 37_688_000,
            "after_micro_usd": 25_250_000, "spot_before_micro_usd": 15_075_200,
            "spot_after_micro_usd": 10_100_000} in outcome["aws"]["changed"]
    assert "ml.m5.large (us-west-2)" in outcome["aws"]["not_found"]

    gcp = rows(tm_home / "catalogs" / "gcp.csv")  # three pages; prediction, N2 and commitment SKUs left out
    assert gcp["n1-standard-8", "us-central1"]["on_demand_usd_per_hour"] == "0.841024"  # 8 core + 30 GiB + 1 T4
    assert gcp["n1-standard-8", "us-central1"]["spot_usd_per_hour"] == "0.23133"  # the Preemptible SKUs
    assert gcp["n1-standard-4", "us-central1"]["on_demand_usd_per_hour"] == "0.219262"
    assert gcp["a2-highgpu-1g", "us-central1"]["on_demand_usd_per_hour"] == "4.221795"  # Tesla A100 (40 GB)
    assert gcp["a2-ultragpu-1g", "us-central1"]["on_demand_usd_per_hour"] == "5.77975"  # A100 80GB
    assert ("n1-highmem-8", "us-central1") not in gcp and "n1-highmem-8 (us-central1)" in outcome["gcp"]["not_found"]

    azure = rows(tm_home / "catalogs" / "azure.csv")  # Windows and reservation rows skipped; low priority over spot
    assert azure["Standard_NC6s_v3", "eastus"]["on_demand_usd_per_hour"] == "3.366"
    assert azure["Standard_NC6s_v3", "eastus"]["spot_usd_per_hour"] == "0.6732"
    assert azure["Standard_D4s_v3", "eastus"]["spot_usd_per_hour"] == "0.0211"
    assert azure["Standard_NC4as_T4_v3", "eastus"]["spot_usd_per_hour"] == "0.17355"  # a $0 spot row is no price
    assert len(azure) == 3

    text = (tm_home / "catalogs" / "azure.csv").read_text()
    stamp = datetime.fromisoformat(text.split("# refreshed: ")[1].split("\n")[0])
    assert abs((datetime.now(timezone.utc) - stamp).total_seconds()) < 120 and "Azure Retail Prices API" in text
    assert any("NextToken" not in r for r in fakes["aws"].requests) and len(fakes["gcp"].requests) == 3


AZURE_READY = ("azure:\n  subscription_id: s\n  resource_group: rg\n  workspace: ws\n  storage_account: acct\n"
               "  datastore: tm_store\n  credential: clouds.azure_credential:fake\n")
"""An Azure set up enough to be planned (only ready backends are: broker/readiness.py); offers never call it."""


def test_offers_use_the_refreshed_price_and_name_its_file(refresh, fakes, tm_home, job_factory):
    (tm_home / "config").mkdir(parents=True, exist_ok=True)
    (tm_home / "config" / "backends.yaml").write_text(AZURE_READY)
    assert refresh("azure").returncode == 0
    job = job_factory("print(1)\n", "workload: initial_training\nresources:\n  gpus: 1\n  gpu_types: [V100]\n")
    done = tm("offers", str(job), "--json", "-p", "cloud-only", home=tm_home)
    offers = [r["offer"] for r in json.loads(done.stdout)["considered"]]
    nc6 = next(o for o in offers if o["instance"] == "Standard_NC6s_v3" and not o["spot"])
    assert nc6["price_per_hour_micro_usd"] == 3_366_000
    today = datetime.now(timezone.utc).date().isoformat()
    assert nc6["quote"]["source"].startswith(f"catalog {tm_home / 'catalogs' / 'azure.csv'}:")
    assert nc6["quote"]["source"].endswith(f"({today})")
    nc12 = next(o for o in offers if o["instance"] == "Standard_NC12s_v3" and not o["spot"])
    assert nc12["price_per_hour_micro_usd"] == 6_120_000 and "backends/catalog/azure.csv" in nc12["quote"]["source"]
    shown = json.loads(tm("catalog", "show", "azure", "--json", home=tm_home).stdout)
    assert [(layer["layer"], layer["rows"], layer["date"]) for layer in shown] == [
        ("shipped", 35, "2025-07-01"), ("refreshed", 3, today)]


def test_the_table_shows_each_change_and_what_was_not_priced(refresh, fakes):
    done = refresh("aws")
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert "ml.p4d.24xlarge (us-east-1): $37.688 → $25.25/h, spot $15.0752 → $10.1/h" in out
    assert "not priced by the API (catalog price kept): ml.m5.xlarge (us-east-1)," in out and "and 74 more (--json)" in out


def test_a_region_the_catalog_has_not_is_added_and_kept(refresh, fakes, tm_home, job_factory):
    """`--region` asks the API for every instance the catalog knows in that region; the ones it prices become rows
    of the refreshed layer, which later refreshes keep and offers in that region use."""
    done = refresh("azure", "--region", "westus2", "--json")
    assert done.returncode == 0, done.stderr
    [outcome] = json.loads(done.stdout)
    assert outcome["added"] == ["Standard_NC6s_v3 (westus2)"]  # the one size the API prices there
    assert rows(tm_home / "catalogs" / "azure.csv")["Standard_NC6s_v3", "westus2"]["on_demand_usd_per_hour"] == "3.06"
    assert refresh("azure").returncode == 0  # a later refresh without --region keeps the region
    assert ("Standard_NC6s_v3", "westus2") in rows(tm_home / "catalogs" / "azure.csv")
    (tm_home / "config").mkdir(parents=True, exist_ok=True)
    (tm_home / "config" / "backends.yaml").write_text(AZURE_READY + "  region: westus2\n")
    job = job_factory("print(1)\n", "workload: initial_training\nresources:\n  gpus: 1\n  gpu_types: [V100]\n")
    offers = [r["offer"] for r in json.loads(tm("offers", str(job), "--json", "-p", "cloud-only",
                                                home=tm_home).stdout)["considered"]]
    nc6 = next(o for o in offers if o["instance"] == "Standard_NC6s_v3" and not o["spot"])
    assert nc6["region"] == "westus2" and nc6["price_per_hour_micro_usd"] == 3_060_000
    nothing = json.loads(refresh("azure", "--region", "northeurope", "--json").stdout)[0]
    assert "the API priced no instance in northeurope" in nothing["not_found"] and nothing["added"] == []


def test_a_500_then_success_is_retried(refresh, fakes, tm_home):
    for fake in fakes.values():
        fake.faults.append((500, json.dumps({"error": {"message": "backend hiccup"}, "__type": "InternalError"})))
    done = refresh("--json")
    assert done.returncode == 0, done.stderr
    assert all(o["ok"] for o in json.loads(done.stdout))
    assert len(fakes["gcp"].requests) == 4 and fakes["gcp"].requests[0] == fakes["gcp"].requests[1]


def test_a_403_fails_with_the_apis_reason_and_keeps_the_earlier_layer(refresh, fakes, tm_home):
    assert refresh("gcp").returncode == 0
    earlier = (tm_home / "catalogs" / "gcp.csv").read_bytes()
    fakes["gcp"].faults.append((403, json.dumps({"error": {"code": 403, "status": "PERMISSION_DENIED",
                                                           "message": "API key not valid. Please pass a valid API key."}})))
    done = refresh("gcp", "azure")
    assert done.returncode == 1
    assert "gcp: Cloud Billing Catalog API: HTTP 403: API key not valid" in " ".join(done.stderr.split())
    assert (tm_home / "catalogs" / "gcp.csv").read_bytes() == earlier
    assert (tm_home / "catalogs" / "azure.csv").is_file()  # the other cloud is still written
    assert len(fakes["gcp"].requests) == 4  # three pages, then the refusal, not retried


@pytest.mark.parametrize("cloud, page, reason", [
    ("azure", '{"Items": [{"type": "Consumption"}], "NextPageLink": null}',
     "Azure Retail Prices API: Items[0].unitOfMeasure: missing"),
    ("aws", '{"FormatVersion": "aws_v1", "PriceList": ["{not json"]}', "AWS Price List API: PriceList[0]: expected a JSON string"),
    ("gcp", "<html>proxy error</html>", "Cloud Billing Catalog API: the answer is not JSON"),
])
def test_a_broken_page_fails_naming_the_field_and_writes_nothing(refresh, fakes, tm_home, cloud, page, reason):
    fakes[cloud].faults.append((200, page))
    done = refresh(cloud, "--json")
    assert done.returncode == 1
    [outcome] = json.loads(done.stdout)
    assert outcome["ok"] is False and reason in outcome["error"]
    assert not (tm_home / "catalogs" / f"{cloud}.csv").exists()
    assert not (tm_home / "catalogs").exists() or not list((tm_home / "catalogs").iterdir())  # no temp file left


def test_an_unreachable_api_is_retried_then_reported(tm_home, apis):
    env = {**apis[1], "TRAINMASTER_AZURE_PRICES_ENDPOINT": "http://127.0.0.1:9"}
    done = tm("catalog", "refresh", "azure", home=tm_home, extra_env=env)
    assert done.returncode == 1 and "Azure Retail Prices API: cannot reach http://127.0.0.1:9" in done.stderr


def test_aws_without_credentials_says_what_is_missing(tm_home, apis, fakes):
    env = {**apis[1], "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}
    done = tm("catalog", "refresh", "aws", home=tm_home, extra_env=env)
    assert done.returncode == 1 and "AWS Price List API: no AWS credentials" in done.stderr
    assert fakes["aws"].requests == []


def test_an_unknown_cloud_is_a_usage_error(refresh):
    done = refresh("aws", "oracle")
    assert done.returncode == 2 and "no price catalog for oracle" in done.stderr
