"""Whether AWS credentials can be found here, asked of botocore's own resolver, without network access.

botocore's default chain, minus the two providers that reach the network (the instance metadata service,
`iam-role`, and the container role, `container-role`). Everything else counts as boto3 would count it —
environment keys, a web-identity token, an SSO profile, `credential_process` (run, as boto3 runs it), an
assumed role, keys in the shared files — and a profile with none of them (only a region, say) does not. On an
EC2 instance or in an ECS/EKS container (backends/cloud_host.py) the role the network would give is "not
checked offline": not a reason to leave AWS out; a refusal at dispatch ends that attempt once with the reason.
botocore is imported only by this check.
"""

from __future__ import annotations

import os

from trainmaster.backends import cloud_host
from trainmaster.backends.aws.config import AwsConfig

NETWORK_PROVIDERS = ("iam-role", "container-role")
WHERE = {
    "env": "environment (AWS_ACCESS_KEY_ID)",
    "shared-credentials-file": "keys in the shared credentials file",
    "config-file": "keys in the config file",
    "sso": "SSO",
    "custom-process": "credential_process",
    "assume-role": "an assumed role",
    "assume-role-with-web-identity": "web identity",
}


def credentials(config: AwsConfig) -> tuple[str | None, str | None]:
    """(where credentials come from, None), (None, why none were found), or (None, None) without botocore
    (the readiness check names the missing extra)."""
    try:
        import botocore.credentials
        import botocore.exceptions
        import botocore.session
    except ImportError:
        return None, None
    session = botocore.session.Session(profile=config.profile)
    profile = session.profile or "default"
    try:
        resolver = botocore.credentials.create_credential_resolver(session)
        for name in NETWORK_PROVIDERS:
            resolver.remove(name)
        found = resolver.load_credentials()
    except botocore.exceptions.ProfileNotFound:
        return None, f"profile {profile!r} not found in {_files(session)}"
    except botocore.exceptions.BotoCoreError as exc:
        return None, f"credentials of profile {profile!r} cannot be loaded: {exc}"
    if found is None:
        return None, (f"no credentials found for profile {profile!r} in {_files(session)} or the environment "
                      "(set AWS_PROFILE or AWS_ACCESS_KEY_ID, or run `aws configure` / `aws sso login`)")
    where = WHERE.get(found.method, found.method)
    return (where if found.method == "env" else f"{where}, profile {profile!r}"), None


def check(config: AwsConfig) -> list[str]:
    why = credentials(config)[1]
    return ([why] if why and not cloud_host.aws() else []) + dispatch(config)


def dispatch(config: AwsConfig) -> list[str]:
    """What backends.yaml must name before a run can be dispatched (the bucket, the execution role, a region)."""
    missing = []
    if not config.s3_bucket:
        missing.append("aws.s3_bucket is not set (the bucket where bundles and outputs are staged)")
    if not config.sagemaker_role_arn:
        missing.append("aws.sagemaker_role_arn is not set (the execution role SageMaker training jobs run as)")
    if not region(config):
        missing.append("no region: set aws.region or AWS_REGION")
    return missing


def region(config: AwsConfig) -> str | None:
    """The region jobs are created in, as boto3 would find it (None without botocore)."""
    if config.region:
        return config.region
    try:
        import botocore.exceptions
        import botocore.session
    except ImportError:
        return None
    try:
        return botocore.session.Session(profile=config.profile).get_config_variable("region")
    except botocore.exceptions.ProfileNotFound:
        return None


def found(config: AwsConfig) -> list[str]:
    where = credentials(config)[0]
    if where:
        return [f"credentials: {where}"]
    role = cloud_host.aws()
    return [f"credentials: not checked offline ({role}, asked at dispatch)"] if role else []


def _files(session) -> str:
    files = (session.get_config_variable("credentials_file"), session.get_config_variable("config_file"))
    return " or ".join(os.path.expanduser(path) for path in files)
