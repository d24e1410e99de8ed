"""A token credential that signs every request with a fixed fake token and never calls Azure AD: what the Azure
tests configure as `azure.credential: clouds.azure_credential:fake` (the CLI's subprocesses import it too)."""

from __future__ import annotations

import time


class FakeCredential:
    def get_token(self, *scopes, **kwargs):
        from azure.core.credentials import AccessToken

        return AccessToken("fake-token", int(time.time()) + 3600)

    def get_token_info(self, *scopes, options=None):
        from azure.core.credentials import AccessTokenInfo

        return AccessTokenInfo("fake-token", int(time.time()) + 3600)


def fake() -> FakeCredential:
    return FakeCredential()
