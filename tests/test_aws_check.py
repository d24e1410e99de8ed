"""`trainmaster backends check` for aws names what dispatch needs from backends.yaml (the bucket, SageMaker's
execution role, a region), without the network; with them set and fake keys in the environment it is ready."""

from __future__ import annotations

from trainmaster.backends.aws.check import check
from trainmaster.backends.aws.config import AwsConfig
from trainmaster.backends.registry import REGISTRY

ROLE = "arn:aws:iam::123456789012:role/trainmaster-sagemaker"


def test_dispatch_needs_bucket_role_and_region(monkeypatch):
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
