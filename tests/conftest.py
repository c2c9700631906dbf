"""Shared fixtures: the live gateway, config overrides, real Redis."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway import config as config_module
from tests.servers import LiveServer

REDIS_URL = "redis://127.0.0.1:6379/15"


@pytest.fixture(autouse=True)
def _fresh_auth_state(request: pytest.FixtureRequest) -> Iterator[None]:
    """No JWKS, discovery document or API-key snapshot leaks from one test into the next.

    Tests without database access run as if no named API key exists (the open gateway), so the
    auth layer never needs the table there.
    """
    from gateway.auth import apikeys, reset_caches

    reset_caches()
    uses_db = request.node.get_closest_marker("django_db") is not None or any(
        name in request.fixturenames for name in ("db", "transactional_db", "django_db_reset_sequences")
    )
    if not uses_db:
        apikeys.pin_no_keys()
    yield
    reset_caches()


@pytest.fixture(autouse=True)
def _fresh_access_log() -> None:
    """The access log decides how to write (its own batched writer or ``logging`` records) when it
    first writes, from the logging set-up of that moment; each test decides again under its own. A
    server thread that logged a request after the test before it ended, when pytest's capture
    handlers were off, left the batched writer behind, and ``caplog`` then saw no access line."""
    from gateway import accesslog

    accesslog.reset()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None) -> Iterator[None]:
    """pytest-django's test databases; before they are dropped, the stored responses' writer gives
    back the connection its thread keeps (``gateway.db.GroupWriter``), which would hold them."""
    yield
    from responses_app.services import final_writes

    final_writes.release()


@pytest.fixture
def gateway_config() -> Iterator[Callable[..., config_module.Config]]:
    """Override the process config for one test: ``gateway_config(llm_api_base=…, server__…=…)``."""
    original = config_module.get_config()

    def apply(**changes: Any) -> config_module.Config:
        new = config_module.replace(config_module.get_config(), **changes)  # cumulative
        config_module.set_config(new)
        return new

    yield apply
    config_module.set_config(original)


def serve_gateway(kind: str = "relay-on") -> Iterator[LiveServer]:
    """The real ASGI application served by uvicorn on a loopback port.

    ``relay-on``: with the protocol ``manage.py serve`` runs (pass-through routes relayed below ASGI
    by ``gateway.relay.callbacks`` where it can); ``relay-off``: what it runs with ``[server]
    direct_relay = false``, every request through the ASGI app (``gateway.fastpath`` for the
    pass-through routes), as daphne and other servers serve it.
    """
    from gateway.asgi import application
    from gateway.relay.protocol import GatewayHttpProtocol, GatewayServerProtocol
    from inference_app.upstream import close_upstreams

    protocols = {"relay-on": GatewayServerProtocol, "relay-off": GatewayHttpProtocol}
    protocol = protocols[kind]
    server = LiveServer(application, on_stop=close_upstreams, http=protocol).start()
    yield server
    server.stop()


@pytest.fixture
def live_gateway(transactional_db: None) -> Iterator[LiveServer]:
    """The gateway as ``manage.py serve`` runs it, on a loopback port (test database attached)."""
    yield from serve_gateway()


@pytest.fixture
def upstream() -> Iterator[Any]:
    """A scripted upstream speaking vLLM's formats on a loopback port."""
    from tests.upstream import ScriptedUpstream

    server = ScriptedUpstream().start()
    yield server
    server.stop()


@pytest.fixture
def idp() -> Iterator[Any]:
    """A real OpenID provider (discovery, JWKS, token endpoints) on a loopback port: tests/oidc_provider.py."""
    from tests.oidc_provider import IdentityProvider

    provider = IdentityProvider().start()
    yield provider
    provider.stop()


@pytest.fixture
def oidc(
    idp: Any, gateway_config: Callable[..., config_module.Config]
) -> Callable[..., config_module.Config]:
    """Switch the gateway to OIDC mode against ``idp``; call it again with more ``auth__…`` changes."""
    from tests.oidc_provider import AUDIENCE

    def apply(**changes: Any) -> config_module.Config:
        return gateway_config(auth__oidc_issuer=idp.issuer, auth__oidc_audience=AUDIENCE, **changes)

    apply()
    return apply
