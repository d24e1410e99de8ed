"""`trainmaster backends check` for aws names what dispatch needs from backends.yaml (the bucket, SageMaker's
execution role, a region), without the network; with them set and fake keys in the environment it is ready."""

from __future__ import annotations

from trainmaster.backends.aws.check import check
from trainmaster.backends.aws.config import AwsConfig
from trainmaster.backends.registry import REGISTRY

ROLE = "arn:aws:iam::123456789012:role/trainmaster-sagemaker"


def test_dispatch_needs_bucket_role_and_region(monkeypatch, tmp_path):
    from trainmaster.backends import cloud_host

    monkeypatch.setattr(cloud_host, "DMI_ROOT", tmp_path / "no-dmi")
    for key in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    reasons = check(AwsConfig())
    assert "aws.s3_bucket is not set (the bucket where bundles and outputs are staged)" in reasons
    assert "aws.sagemaker_role_arn is not set (the execution role SageMaker training jobs run as)" in reasons
    assert "no region: set aws.region or AWS_REGION" in reasons


def test_ready_with_them_set(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    config = AwsConfig(s3_bucket="b", sagemaker_role_arn=ROLE)
    reasons, found = REGISTRY["aws"].readiness(config)
    assert reasons == [] and found == ["credentials: environment (AWS_ACCESS_KEY_ID)"]


def test_on_a_cloud_machine_the_role_is_not_checked_offline_rather_than_missing(monkeypatch, tmp_path):
    """No keys here, but an EC2 instance's role (or an ECS task's) answers at dispatch: "not checked offline", and
    AWS stays in planning."""
    from trainmaster.backends import cloud_host

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setattr(cloud_host, "DMI_ROOT", tmp_path / "dmi")
    config = AwsConfig(s3_bucket="b", sagemaker_role_arn=ROLE, region="us-east-1")
    reasons, found = REGISTRY["aws"].readiness(config)
    assert reasons and reasons[0].startswith("no credentials found")  # a laptop: none, and no role to ask
    (tmp_path / "dmi").mkdir()
    (tmp_path / "dmi" / "sys_vendor").write_text("Amazon EC2\n")
    reasons, found = REGISTRY["aws"].readiness(config)
    assert reasons == [] and found == ["credentials: not checked offline (this EC2 instance's role (its metadata "
                                       "service), asked at dispatch)"]
    (tmp_path / "dmi" / "sys_vendor").write_text("QEMU\n")
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/credentials/abc")
    assert "ECS/EKS" in REGISTRY["aws"].readiness(config)[1][0]
