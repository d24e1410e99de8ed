"""`python -m remote_executor.cli ARGS`: the real `trainmaster` CLI with the remote harness registered,
as the registry would list a backend of its own: the client of client.py under the untrusted `bittensor`
entry or, with TRAINMASTER_TEST_EXECUTOR_TRUSTED=1, under the trusted `local` entry. The executor is
found at $TRAINMASTER_TEST_EXECUTOR_URL. The processes the CLI starts (a read's background pass) register it too
(tests/child_site/sitecustomize.py)."""

from __future__ import annotations

import dataclasses
import os

TRUSTED_ENV = "TRAINMASTER_TEST_EXECUTOR_TRUSTED"
UNTRUSTED = ("bittensor", "remote_executor.client:RemoteExecutor")
TRUSTED = ("local", "remote_executor.client:TrustedRemoteExecutor")


def register(trusted: bool) -> None:
    """Point the registry's entry at the harness client (its trust stays the entry's own)."""
    from trainmaster.backends import registry

    name, target = TRUSTED if trusted else UNTRUSTED
    registry.REGISTRY[name] = dataclasses.replace(registry.REGISTRY[name], target=target)
    registry.BACKENDS[name] = target


def main() -> None:
    register(os.environ.get(TRUSTED_ENV) == "1")
    from child_hooks import hooked

    hooked("remote_executor")  # the background pass a read starts (a process of its own) sees the harness too
    from trainmaster.broker.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
