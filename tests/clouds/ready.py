"""Set the three clouds up as a user would for planning only: enough that `trainmaster backends check` calls them
ready (credentials it can see, a bucket, a role, a region, a workspace and its datastore), so tests of planning
over the price catalogs see their offers (only ready clouds are planned: broker/readiness.py). Nothing is ever
dispatched to them: the names lead nowhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROLE = "arn:aws:iam::123456789012:role/trainmaster-sagemaker"


def backends_yaml(folder: Path) -> str:
    """backends.yaml text for the three clouds; the GCP key file it names is written in `folder`."""
    key = folder / "gcp-planning-key.json"
    key.write_text(json.dumps({"type": "service_account", "project_id": "planning", "client_email": "x@planning.iam"}))
    return (f"aws:\n  region: us-east-1\n  s3_bucket: planning-bucket\n  sagemaker_role_arn: {ROLE}\n"
            f"gcp:\n  project: planning\n  staging_bucket: gs://planning-bucket/runs\n  credentials_file: {key}\n"
            "azure:\n  subscription_id: 00000000-0000-0000-0000-000000000000\n  resource_group: rg\n"
            "  workspace: ws\n  storage_account: planning\n  datastore: planning_store\n"
            "  credential: clouds.azure_credential:fake\n")


ENV = {"AWS_ACCESS_KEY_ID": "planning", "AWS_SECRET_ACCESS_KEY": "planning", "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.fixture
def ready_clouds(tm_home, tmp_path_factory, monkeypatch):
    """The three clouds ready for planning in this test's home (and environment)."""
    config = tm_home / "config"
    config.mkdir(parents=True, exist_ok=True)
    existing = (config / "backends.yaml").read_text() if (config / "backends.yaml").is_file() else ""
    (config / "backends.yaml").write_text(existing + backends_yaml(tmp_path_factory.mktemp("ready")))
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    return tm_home
