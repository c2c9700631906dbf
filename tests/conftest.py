"""Shared fixtures: the live gateway, config overrides, real Redis."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway import config as config_module
from tests.servers import LiveServer

REDIS_URL = "redis://127.0.0.1:6379/15"


@pytest.fixture
def gateway_config() -> Iterator[Callable[..., config_module.Config]]:
    """Override the process config for one test: ``gateway_config(llm_api_base=…, server__…=…)``."""
    original = config_module.get_config()

    def apply(**changes: Any) -> config_module.Config:
        new = config_module.replace(original, **changes)
        config_module.set_config(new)
        return new

    yield apply
    config_module.set_config(original)


@pytest.fixture
def live_gateway(transactional_db: None) -> Iterator[LiveServer]:
    """The real ASGI application served by uvicorn on a loopback port (test database attached)."""
    from gateway.asgi import application
    from inference_app.upstream import close_upstreams

    server = LiveServer(application, on_stop=close_upstreams).start()
    yield server
    server.stop()


@pytest.fixture
def upstream() -> Iterator[Any]:
    """A scripted upstream speaking vLLM's formats on a loopback port."""
    from tests.upstream import ScriptedUpstream

    server = ScriptedUpstream().start()
    yield server
    server.stop()
