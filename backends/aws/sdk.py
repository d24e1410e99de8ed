"""The AWS SDK, imported only when called, so the backend imports without the `aws` extra: one boto3 session
per configuration (its profile, region and assumed role), one client per service created once from it, and
botocore's errors turned into the core's typed ones.

botocore does not retry on its own here (`max_attempts` 1): the broker's retry (`backends.retry`) is the one.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TypeVar

from trainmaster.backends.aws.config import AwsConfig
from trainmaster.backends.base import BackendError, CapacityError, ConfigurationError, TransientBackendError

T = TypeVar("T")
THROTTLED = {"ThrottlingException", "Throttling", "ThrottledException", "RequestLimitExceeded", "SlowDown",
             "TooManyRequestsException", "RequestThrottled", "RequestThrottledException"}
UNAVAILABLE = {"InternalError", "InternalFailure", "InternalServerError", "ServiceUnavailable", "ServiceUnavailableException"}
NO_CAPACITY = {"CapacityError", "InsufficientCapacity", "InsufficientInstanceCapacity"}
QUOTA = {"ResourceLimitExceeded"}
"""SageMaker's answer when the account's quota for the instance type (on-demand or spot training) is too low: a
new account's GPU quotas are 0, raised through Service Quotas."""
MISSING = {"NoSuchBucket"}
ROLE = ("role", "PassRole", "assume")
"""Words of a ValidationException about the execution role (it cannot be assumed, or not passed)."""
DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "InvalidAccessKeyId", "SignatureDoesNotMatch",
          "ExpiredToken", "ExpiredTokenException", "InvalidClientTokenId", "UnrecognizedClientException"}
SESSION_S = 3600


def boto3():
    import boto3

    return boto3


@functools.lru_cache(maxsize=8)
def session(config: AwsConfig):
    """The boto3 session for `config`: its profile and region, and, with `role_arn`, that role's credentials
    (refreshed by botocore before they expire)."""
    try:
        base = boto3().Session(profile_name=config.profile, region_name=config.region)
    except Exception as exc:
        raise typed_error("AWS session", exc) or exc from exc
    if not config.role_arn:
        return base
    import botocore.credentials
    import botocore.session

    sts = base.client("sts", endpoint_url=config.endpoint_url, config=_client_config())

    def assume() -> dict:
        found = sts.assume_role(RoleArn=config.role_arn, RoleSessionName="trainmaster",
                                DurationSeconds=SESSION_S)["Credentials"]
        return {"access_key": found["AccessKeyId"], "secret_key": found["SecretAccessKey"],
                "token": found["SessionToken"], "expiry_time": found["Expiration"].isoformat()}

    core = botocore.session.Session()
    core._credentials = botocore.credentials.RefreshableCredentials.create_from_metadata(
        assume(), assume, "assume-role")
    return boto3().Session(botocore_session=core, region_name=base.region_name)


@functools.lru_cache(maxsize=32)
def client(config: AwsConfig, service: str):
    """The one `service` client ("s3", "sagemaker") for `config`, created once."""
    return session(config).client(service, endpoint_url=config.endpoint_url, config=_client_config())


def _client_config():
    import botocore.config

    return botocore.config.Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=10,
                                  read_timeout=60)


async def call(what: str, fn: Callable[..., T], *args, **kwargs) -> T:
    """`fn(*args, **kwargs)` off the event loop, its SDK errors typed; `what` names the call in messages."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except Exception as exc:
        typed = typed_error(what, exc)
        if typed is None:
            raise
        raise typed from exc


def error_code(exc: BaseException) -> tuple[str, int]:
    """A ClientError's code and HTTP status ("", 0 for anything else)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return "", 0
    return str(response.get("Error", {}).get("Code", "")), int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def typed_error(what: str, exc: BaseException) -> BackendError | None:
    """The core's error for an SDK failure, None for what is not the SDK's (left to propagate as it is)."""
    import boto3.exceptions
    import botocore.exceptions as bx

    if isinstance(exc, (boto3.exceptions.S3UploadFailedError, boto3.exceptions.S3TransferFailedError)):
        cause = exc.__cause__ or exc.__context__
        return typed_error(what, cause) if cause is not None else TransientBackendError(f"{what}: {exc}")
    if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError, bx.ProfileNotFound, bx.NoRegionError)):
        return ConfigurationError(f"{what}: {exc} (set the credentials, profile or region in the environment or "
                                  "under `aws:` in backends.yaml)")
    if isinstance(exc, (bx.ConnectionError, bx.HTTPClientError)):
        return TransientBackendError(f"{what}: {exc}")
    if not isinstance(exc, bx.ClientError):
        return BackendError(f"{what}: {exc}") if isinstance(exc, bx.BotoCoreError) else None
    code, status = error_code(exc)
    message = exc.response.get("Error", {}).get("Message") or code
    if code in THROTTLED or code in UNAVAILABLE or status == 429 or status >= 500:
        return TransientBackendError(f"{what}: {code} ({message})")
    if code in NO_CAPACITY:
        return CapacityError(f"{what}: {code} ({message})")
    if code in QUOTA:
        return ConfigurationError(f"{what}: {code} ({message}); raise the quota in Service Quotas (SageMaker, "
                                  "'<instance> for training job usage' or '… for spot training job usage')")
    if code in MISSING:
        return ConfigurationError(f"{what}: {code} ({message}); create the bucket or fix aws.s3_bucket")
    if code in DENIED or status == 403:
        return ConfigurationError(f"{what}: permission denied: {code} ({message}); the credentials need that "
                                  "permission (docs/clouds.md lists the actions)")
    if code == "ValidationException" and any(word in message for word in ROLE):
        return ConfigurationError(f"{what}: {code} ({message}); check aws.sagemaker_role_arn, its trust for "
                                  "sagemaker.amazonaws.com and your iam:PassRole on it")
    return BackendError(f"{what}: {code} ({message})")
