"""Whether AWS credentials can be found here, without network access.

Looks where boto3's default chain looks before it asks the instance metadata service (which takes
the network, so an instance role is not seen: set AWS_PROFILE or keys there): environment keys,
a web-identity token, container credentials, then the profile in the shared files.
"""

from __future__ import annotations

import configparser
import os
from pathlib import Path

from trainmaster.backends.aws.config import AwsConfig


def credentials(config: AwsConfig) -> tuple[str | None, str | None]:
    """(where credentials come from, None) or (None, why none were found)."""
    env = os.environ
    if config.profile is None:
        if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
            return "environment (AWS_ACCESS_KEY_ID)", None
        if env.get("AWS_WEB_IDENTITY_TOKEN_FILE") and env.get("AWS_ROLE_ARN"):
            return "web identity (AWS_WEB_IDENTITY_TOKEN_FILE)", None
        if env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") or env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI"):
            return "container credentials", None
    profile = config.profile or env.get("AWS_PROFILE") or "default"
    files = [
        (Path(env.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials")).expanduser(), profile),
        (Path(env.get("AWS_CONFIG_FILE", "~/.aws/config")).expanduser(),
         profile if profile == "default" else f"profile {profile}"),
    ]
    for path, section in files:
        if section in _sections(path):
            return f"profile {profile!r} in {path}", None
    if profile != "default":
        return None, f"profile {profile!r} not found in {files[0][0]} or {files[1][0]}"
    return None, "no credentials found (set AWS_PROFILE or AWS_ACCESS_KEY_ID, or run `aws configure`)"


def check(config: AwsConfig) -> list[str]:
    return [why] if (why := credentials(config)[1]) else []


def found(config: AwsConfig) -> list[str]:
    where = credentials(config)[0]
    return [f"credentials: {where}"] if where else []


def _sections(path: Path) -> list[str]:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError):
        return []
    return parser.sections()
