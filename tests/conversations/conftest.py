"""Fixtures for the Conversations tests: SDK clients on a live gateway, two principals."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from django.test import override_settings

from tests.servers import LiveServer

OWNER_HEADER = "x-test-owner"


class HeaderPrincipalMiddleware:
    """Test-only: the principal named by ``x-test-owner`` (the auth issue sets real ones)."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        from gateway.core.principal import Principal

        owner = request.headers.get(OWNER_HEADER)
        if owner:
            request.principal = Principal(owner=owner, kind="api_key", subject=owner)
        return self.get_response(request)


def sdk(base_url: str, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="sk-test", max_retries=0, default_headers=headers)


@pytest.fixture
def client(live_gateway: LiveServer) -> openai.OpenAI:
    """The official SDK against the real gateway, as the default principal."""
    return sdk(live_gateway.url)


@pytest.fixture
def owned_gateway(transactional_db: None, settings: Any) -> Iterator[LiveServer]:
    """The gateway with a test middleware that sets ``request.principal`` from a header."""
    from django.core.handlers.asgi import ASGIHandler

    from gateway.core.middleware import GatewayASGIMiddleware

    middleware = [*settings.MIDDLEWARE]
    middleware.insert(
        middleware.index("gateway.core.middleware.GatewayErrorMiddleware"),
        "tests.conversations.conftest.HeaderPrincipalMiddleware",
    )
    with override_settings(MIDDLEWARE=middleware):
        app = GatewayASGIMiddleware(ASGIHandler())
    server = LiveServer(app).start()
    yield server
    server.stop()
