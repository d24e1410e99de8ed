"""The GCP readiness check (backends/gcp/check.py): credentials, the staging bucket and the project, off the network."""

from __future__ import annotations

import json

import pytest

from trainmaster.backends.gcp import check
from trainmaster.backends.gcp.config import GcpConfig


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    from trainmaster.backends import cloud_host

    monkeypatch.setattr(cloud_host, "DMI_ROOT", tmp_path / "no-dmi")  # not a GCE VM, wherever the test runs
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "GCE_METADATA_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))


def key(tmp_path, **info):
    path = tmp_path / "key.json"
    path.write_text(json.dumps({"type": "service_account", **info}))
    return str(path)


def test_nothing_configured_says_all_three(tmp_path):
    reasons = check.check(GcpConfig())
    assert len(reasons) == 3
    assert reasons[0].startswith("no credentials found")
    assert "gcp.staging_bucket" in reasons[1] and "gcp.project" in reasons[2]


def test_a_key_file_naming_its_project_and_a_bucket_is_ready(tmp_path):
    config = GcpConfig(credentials_file=key(tmp_path, project_id="p1"), staging_bucket="gs://b/runs")
    assert check.check(config) == []
    assert check.project(config) == "p1"
    assert check.found(config) == [f"credentials: credentials_file ({tmp_path / 'key.json'})"]


def test_the_project_from_the_config_or_the_environment(tmp_path, monkeypatch):
    config = GcpConfig(credentials_file=key(tmp_path), staging_bucket="gs://b")
    assert any("gcp.project" in r for r in check.check(config))
    assert check.check(config.model_copy(update={"project": "p2"})) == []
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "p3")
    assert check.project(config) == "p3" and check.check(config) == []


def test_a_named_file_that_is_missing_is_said(tmp_path):
    reasons = check.check(GcpConfig(credentials_file=str(tmp_path / "nope.json"), project="p", staging_bucket="gs://b"))
    assert reasons == [f"credentials_file names {tmp_path / 'nope.json'}, which does not exist"]


def test_on_a_gce_vm_the_service_account_is_not_checked_offline(tmp_path, monkeypatch):
    from trainmaster.backends import cloud_host

    monkeypatch.setattr(cloud_host, "DMI_ROOT", tmp_path / "dmi")
    monkeypatch.delenv("GCE_METADATA_HOST", raising=False)
    config = GcpConfig(project="p", staging_bucket="gs://b")
    assert check.check(config)[0].startswith("no credentials found")
    (tmp_path / "dmi").mkdir()
    (tmp_path / "dmi" / "product_name").write_text("Google Compute Engine\n")
    assert check.check(config) == []
    assert check.found(config) == ["credentials: not checked offline (this VM's service account (the GCE metadata "
                                   "server), asked at dispatch)"]
