"""AWS settings (`aws:` in backends.yaml). Credentials are not kept here: they come from boto3's own
chain (environment, `~/.aws`, a role), optionally through a named profile or an assumed role."""

from __future__ import annotations

from pydantic import Field

from trainmaster.backends.base import BackendConfig


class AwsConfig(BackendConfig):
    profile: str | None = Field(None, description="Profile in ~/.aws/config or credentials; default: AWS_PROFILE, else the default chain.")
    region: str | None = Field(None, description="API region (us-east-1); default: the profile's or AWS_REGION.")
    role_arn: str | None = Field(None, pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$", description="Role assumed for every call.")
    endpoint_url: str | None = Field(None, description="Another API endpoint (a VPC endpoint, LocalStack).")
    s3_bucket: str | None = Field(None, description="Bucket where bundles and outputs are staged.")
    s3_prefix: str = Field("trainmaster/", description="Key prefix inside the bucket.")
