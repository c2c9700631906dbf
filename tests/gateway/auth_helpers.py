"""Fixtures shared by the auth tests (import them into a test module to use them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway import config as config_module
from tests.oidc_provider import AUDIENCE, IdentityProvider


@pytest.fixture
def idp() -> Iterator[IdentityProvider]:
    """A real OpenID provider (discovery + JWKS + token endpoints) on a loopback port."""
    provider = IdentityProvider().start()
    yield provider
    provider.stop()


@pytest.fixture
def oidc(idp: IdentityProvider, gateway_config: Callable[..., config_module.Config]) -> Callable[..., Any]:
    """Switch the gateway to OIDC mode against ``idp``; extra ``auth__…`` changes pass through."""

    def apply(**changes: Any) -> config_module.Config:
        return gateway_config(auth__oidc_issuer=idp.issuer, auth__oidc_audience=AUDIENCE, **changes)

    apply()
    return apply


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
