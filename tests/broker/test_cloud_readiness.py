"""Only ready backends are planned, through the real CLI: `trainmaster offers` and `submit --dry-run` under the
shipped cloud-only policy on a machine with no cloud set up offer nothing and say, per cloud, why it is not ready
(no credentials, no bucket, no execution role, no workspace); set up AWS alone (fake keys, a bucket, a role) and
AWS is planned while the others are still said to be unavailable. The gate and the block that follows a
configuration failure at dispatch are the broker's (broker/readiness.py)."""

from __future__ import annotations

import json
import textwrap

import pytest

from cli_run import tm
from trainmaster.broker import readiness

ROLE = "arn:aws:iam::123456789012:role/trainmaster-sagemaker"


@pytest.fixture
def bare(tmp_path, monkeypatch):
    """A home and an environment with no cloud set up: no keys, no profiles, no gcloud or az folders."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION",
                 "AWS_DEFAULT_REGION", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "GCE_METADATA_HOST", "AZURE_CLIENT_ID",
                 "AZURE_TENANT_ID", "AZURE_SUBSCRIPTION_ID", "AZURE_STORAGE_CONNECTION_STRING", "IDENTITY_ENDPOINT",
                 "MSI_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws" / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws" / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(tmp_path / "no-az"))
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text("print('hi')\n")
    (job / "job.yaml").write_text("name: ready\nentrypoint: python train.py\n")
    return home, job / "job.yaml"


def test_no_cloud_set_up_plans_nothing_and_says_why_per_cloud(bare):
    home, job = bare
    done = tm("offers", str(job), "--policy", "cloud-only", "--json", home=home)
    assert done.returncode == 1, done.stdout + done.stderr  # nothing can run: not a loop of failed dispatches
    shown = json.loads(done.stdout)
    assert shown["chosen"] is None and shown["considered"] == []
    why = shown["unavailable"]
    assert set(why) == {"aws", "gcp", "azure"}, why
    assert all(reasons[0].startswith("not ready: ") for reasons in why.values()), why
    from trainmaster.backends import cloud_host

    if cloud_host.aws() is None:  # a laptop: no keys and no instance role (on EC2 the role is asked at dispatch)
        assert "no credentials found" in why["aws"][0]
    assert "aws.s3_bucket is not set" in why["aws"][0]
    assert "aws.sagemaker_role_arn is not set" in why["aws"][0]
    assert "gcp.staging_bucket" in why["gcp"][0] and "no Azure ML workspace" in why["azure"][0]
    table = tm("offers", str(job), "--policy", "cloud-only", home=home)
    assert "aws: not ready: " in table.stdout and "azure: not ready: " in table.stdout, table.stdout


def test_dry_run_says_the_same(bare):
    home, job = bare
    done = tm("submit", str(job), "--policy", "cloud-only", "--dry-run", "--json", home=home)
    assert done.returncode != 0
    assert "not ready: " in done.stdout + done.stderr and "aws.s3_bucket is not set" in done.stdout + done.stderr


def test_the_cloud_that_is_set_up_is_planned_and_the_others_say_why_not(bare, monkeypatch):
    home, job = bare
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    (home / "config" / "backends.yaml").write_text(textwrap.dedent(f"""\
        aws:
          region: us-east-1
          s3_bucket: my-training-bucket
          sagemaker_role_arn: {ROLE}
        """))
    done = tm("submit", str(job), "--policy", "cloud-only", "--dry-run", "--json", home=home)
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(json.loads(done.stdout)["unavailable"]) == {"gcp", "azure"}, done.stdout
    offers = json.loads(tm("offers", str(job), "--policy", "cloud-only", "--json", home=home).stdout)
    assert offers["chosen"].startswith("aws/") and {o["offer"]["backend"] for o in offers["considered"]} == {"aws"}
    assert set(offers["unavailable"]) == {"gcp", "azure"}


def test_a_misconfigured_attempt_blocks_its_backend_for_the_job():
    """The cause `misconfigured` on an attempt's end event blocks its whole backend (not one offer) in later plans."""
    from types import SimpleNamespace as N

    attempts = [N(id="j.1", backend="aws"), N(id="j.2", backend="gcp"), N(id="j.3", backend="azure")]
    events = [N(kind="attempt", attempt_id="j.1", detail={"cause": "misconfigured", "reason": "NoSuchBucket"}),
              N(kind="attempt", attempt_id="j.2", detail={"cause": "capacity"}),
              N(kind="error", attempt_id="j.3", detail={"cause": "misconfigured"})]
    assert readiness.blocked_backends(attempts, events) == frozenset({"aws"})
