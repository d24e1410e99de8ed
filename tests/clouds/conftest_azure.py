"""Fixtures of the Azure tests (registered with `pytest_plugins = ["clouds.conftest_azure"]`): the servers once
per session, and per test a fresh container, no jobs, and an AzureConfig pointing at both."""

from __future__ import annotations

import uuid

import pytest

from clouds.azure_server import start_azure
from clouds.container import IMAGE


@pytest.fixture(scope="session")
def test_image():
    """The image the runner starts containers from: torch and numpy, no trainmaster (clouds/container.py)."""
    from clouds.container import shared

    return shared()


@pytest.fixture(autouse=True)
def _requests_keep_the_rules():
    """Fails the test when a request broke the service's own rules (clouds/checked.py)."""
    from clouds import checked

    start = checked.mark()
    yield
    checked.assert_clean(start)


@pytest.fixture(scope="session")
def azure_servers():
    servers = start_azure()
    yield servers
    servers.stop()


@pytest.fixture
def azure(azure_servers, monkeypatch):
    """The servers, reset, with this process's environment pointing the SDKs at them."""
    azure_servers.fake.reset()
    for name, value in azure_servers.env.items():
        monkeypatch.setenv(name, value)
    return azure_servers


@pytest.fixture
def azure_config(azure):
    from trainmaster.backends.azure.config import AzureConfig

    container = f"c{uuid.uuid4().hex[:12]}"
    azure.fake.datastores["trainmaster_store"] = container  # the user's one-time set-up: a datastore for it
    return AzureConfig(resource_group="rg", workspace="ws", container=container, datastore="trainmaster_store",
                       credential="clouds.azure_credential:fake", poll_s=0.1, block_mb=1, image=IMAGE)
