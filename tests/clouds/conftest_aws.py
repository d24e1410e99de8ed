"""Fixtures of the AWS tests (registered with `pytest_plugins = ["clouds.conftest_aws"]`): moto started once per
session, emptied per test, fake keys in the environment, the staging bucket, an AwsConfig pointing at it."""

from __future__ import annotations

import pytest

from clouds.aws_server import BUCKET, REGION, ROLE, MotoAws

FAKE_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": "/nonexistent/aws-config", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials"}


@pytest.fixture(scope="session")
def moto_aws():
    server = MotoAws()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def test_image():
    """The image the runner starts containers from: torch and numpy, no trainmaster (clouds/container.py)."""
    from clouds.container import shared

    return shared()


@pytest.fixture(autouse=True)
def _requests_keep_the_rules():
    """Fails the test when a request broke SageMaker's or S3's rules (clouds/rules_aws.py)."""
    from clouds import checked

    start = checked.mark()
    yield
    checked.assert_clean(start)


@pytest.fixture
def aws(moto_aws, monkeypatch):
    """moto, empty, with the bucket; fake keys only (nothing can reach AWS)."""
    from trainmaster.backends.aws import sdk

    for key, value in FAKE_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    sdk.session.cache_clear()
    sdk.client.cache_clear()
    moto_aws.reset()
    moto_aws.client("s3").create_bucket(Bucket=BUCKET)
    return moto_aws


@pytest.fixture
def aws_config(aws):
    from trainmaster.backends.aws.config import AwsConfig

    return AwsConfig(endpoint_url=aws.endpoint, region=REGION, s3_bucket=BUCKET, sagemaker_role_arn=ROLE,
                     multipart_mb=5, poll_s=0.1)
