"""The GCP fixtures (registered by `pytest_plugins = ["clouds.conftest_gcp"]` in the GCP test files): the local
servers once per session, reset per test, and the environment the SDKs and the CLI subprocesses need."""

from __future__ import annotations

import pytest

from clouds import gcp_server


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
def gcp_servers():
    servers = gcp_server.start()
    yield servers
    servers.stop()


@pytest.fixture
def gcp(gcp_servers, tmp_path_factory, monkeypatch):
    """The servers, reset, with fake credentials and the storage emulator in the environment (never real ones)."""
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcp_servers.gcs_url)
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    gcp_servers.reset()
    gcp_servers.credentials = gcp_servers.credentials_file(tmp_path_factory.mktemp("gcp"))
    return gcp_servers
