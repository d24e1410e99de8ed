"""AWS settings (`aws:` in backends.yaml). Credentials are not kept here: they come from boto3's own
chain (environment, `~/.aws`, a role), optionally through a named profile or an assumed role."""

from __future__ import annotations

from pydantic import Field

from trainmaster.backends.managed.config import ManagedConfig


class AwsConfig(ManagedConfig):
    profile: str | None = Field(None, description="Profile in ~/.aws/config or credentials; default: AWS_PROFILE, else the default chain.")
    region: str | None = Field(None, description="API region (us-east-1); default: the profile's or AWS_REGION.")
    role_arn: str | None = Field(None, pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$", description="Role assumed for every call.")
    endpoint_url: str | None = Field(None, description="Another API endpoint (a VPC endpoint, LocalStack).")
    s3_bucket: str | None = Field(None, description="Bucket where bundles and outputs are staged.")
    s3_prefix: str = Field("trainmaster/", description="Key prefix inside the bucket.")
    sagemaker_role_arn: str | None = Field(None, pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$",
                                           description="The execution role SageMaker training jobs run as (reads the "
                                                       "bundle, writes the bucket); required to dispatch.")
    volume_size_gb: int = Field(50, ge=1, description="The EBS volume each training instance gets (ResourceConfig.VolumeSizeInGB).")
    service_retries: int = Field(1, ge=1, le=30, description="How often SageMaker itself retries a job that failed "
                                                            "for an internal error (RetryStrategy.MaximumRetryAttempts); "
                                                            "the job resumes from its synced checkpoints.")
    multipart_mb: int = Field(8, ge=5, description="Part size of S3 multipart uploads, and the size above which a "
                                                   "file is sent in parts.")
