"""WebSocket authentication: refusal at the upgrade (HTTP 401 before accept) and token expiry."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.core import errors
from gateway.core.auth.websocket import WebSocketAuthMiddleware, ensure_not_expired
from gateway.core.principal import Principal
from tests.oidc_provider import IdentityProvider
from tests.servers import LiveServer

INVALID = {
    "message": "invalid bearer token",
    "type": "authentication_error",
    "param": None,
    "code": "invalid_token",
}


def ws_url(server: LiveServer, path: str) -> str:
    return server.url.replace("http://", "ws://") + path


@pytest.fixture
def probe_server(transactional_db: None) -> Iterator[LiveServer]:
    """The probe consumer behind the same WebSocket wiring as gateway/asgi.py (Channels touches the DB)."""
    from tests.core.auth.ws_auth_testing import application

    server = LiveServer(application).start()
    yield server
    server.stop()


async def refused(url: str, headers: dict[str, str] | None = None) -> Any:
    with pytest.raises(InvalidStatus) as info:
        async with connect(url, additional_headers=headers or {}, open_timeout=5):
            pass
    return info.value.response


async def test_upgrade_without_token_is_refused_with_401(live_gateway: LiveServer, oidc: Any) -> None:
    response = await refused(ws_url(live_gateway, "/v1/responses"))
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert json.loads(response.body) == {"error": {**INVALID, "code": "missing_bearer_token"}}


async def test_upgrade_with_rejected_token_is_refused_with_401(
    live_gateway: LiveServer, idp: IdentityProvider, oidc: Any
) -> None:
    response = await refused(
        ws_url(live_gateway, "/v1/responses"), {"Authorization": f"Bearer {idp.mint(aud='other')}"}
    )
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert json.loads(response.body) == {"error": INVALID}


async def test_upgrade_with_provider_down_is_503(
    live_gateway: LiveServer, idp: IdentityProvider, oidc: Any
) -> None:
    token = idp.mint()
    idp.stop()
    response = await refused(ws_url(live_gateway, "/v1/responses"), {"Authorization": f"Bearer {token}"})
    assert response.status_code == 503
    assert "www-authenticate" not in response.headers
    assert json.loads(response.body)["error"]["code"] == "identity_provider_unavailable"


async def test_valid_token_reaches_the_responses_consumer(
    live_gateway: LiveServer, idp: IdentityProvider, oidc: Any
) -> None:
    headers = {"Authorization": f"Bearer {idp.mint()}"}
    async with connect(ws_url(live_gateway, "/v1/responses"), additional_headers=headers) as ws:
        await ws.send(json.dumps({"type": "response.create", "stream_id": "s"}))
        event = json.loads(await ws.recv())
    # The real consumer answered (a request without a model is invalid): the upgrade was accepted.
    assert event["type"] == "error" and event["status"] == 400 and event["stream_id"] == "s"


async def test_principal_is_on_the_scope(probe_server: LiveServer, idp: IdentityProvider, oidc: Any) -> None:
    headers = {"Authorization": f"Bearer {idp.mint(sub='dora')}"}
    async with connect(ws_url(probe_server, "/v1/test/ws"), additional_headers=headers) as ws:
        await ws.send(json.dumps({"type": "response.create", "stream_id": "a"}))
        assert json.loads(await ws.recv()) == {
            "type": "ok",
            "stream_id": "a",
            "owner": f"oidc:{idp.issuer}#dora",
        }


async def test_expired_connection_refuses_new_and_queued_work(
    probe_server: LiveServer, idp: IdentityProvider, oidc: Any
) -> None:
    oidc(auth__leeway_s=30)  # leeway forgives clock skew at validation, not an expired session
    exp = int(time.time()) + 2
    headers = {"Authorization": f"Bearer {idp.mint(exp=exp)}"}
    async with connect(ws_url(probe_server, "/v1/test/ws"), additional_headers=headers) as ws:
        await ws.send(json.dumps({"type": "response.create", "stream_id": "before"}))
        assert json.loads(await ws.recv())["type"] == "ok"
        # Queued before expiry, starts after it.
        delay = exp - time.time() + 0.8
        await ws.send(json.dumps({"type": "response.create", "stream_id": "queued", "delay": delay}))
        assert json.loads(await ws.recv()) == {"type": "queued", "stream_id": "queued"}
        await asyncio.sleep(max(0.0, exp - time.time()) + 0.2)
        await ws.send(json.dumps({"type": "response.create", "stream_id": "after"}))
        events = {}
        for _ in range(2):
            event = json.loads(await asyncio.wait_for(ws.recv(), 5))
            events[event["stream_id"]] = event
    for stream_id in ("after", "queued"):
        assert events[stream_id] == {"type": "error", "stream_id": stream_id, "status": 401, "error": INVALID}


async def test_api_key_mode_guards_the_upgrade(probe_server: LiveServer) -> None:
    from asgiref.sync import sync_to_async

    from gateway.core.auth import apikeys

    key, secret = await sync_to_async(apikeys.apikey_create)(name="ws")
    response = await refused(ws_url(probe_server, "/v1/test/ws"))
    assert response.status_code == 401
    assert json.loads(response.body)["error"]["code"] == "missing_bearer_token"
    async with connect(ws_url(probe_server, "/v1/test/ws"), additional_headers={"x-api-key": secret}) as ws:
        await ws.send(json.dumps({"type": "response.create"}))
        assert json.loads(await ws.recv())["owner"] == f"key:{key.pk}"
        # API keys do not expire.
        await ws.send(json.dumps({"type": "response.create"}))
        assert json.loads(await ws.recv())["type"] == "ok"


async def test_server_without_http_response_extension_gets_close_before_accept(oidc: Any) -> None:
    """Daphne has no ``websocket.http.response``: refuse with close 1008 before accept (→ HTTP 403)."""
    sent: list[dict[str, Any]] = []
    reached = False

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal reached
        reached = True

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "websocket", "path": "/v1/responses", "headers": [], "extensions": {}}
    await WebSocketAuthMiddleware(app)(scope, receive, send)
    assert sent == [{"type": "websocket.close", "code": 1008}]
    assert not reached


def test_ensure_not_expired() -> None:
    ensure_not_expired({})  # the default principal never expires
    ensure_not_expired({"principal": Principal(owner="key:1", kind="api_key")})
    live = {"principal": Principal(owner="o", kind="oidc", expires_at=time.time() + 60)}
    ensure_not_expired(live)
    with pytest.raises(errors.AuthenticationFailed) as info:
        ensure_not_expired(live, now=time.time() + 61)
    assert info.value.code == "invalid_token" and info.value.status == 401


@pytest.mark.process
async def test_daphne_refuses_the_upgrade_before_accept(idp: IdentityProvider) -> None:
    """Under daphne (no ``websocket.http.response``) the refusal is a 403 handshake answer."""
    from tests.servers import GatewayProcess

    gateway = GatewayProcess(
        {"OIDC_ISSUER": idp.issuer, "OIDC_AUDIENCE": "gateway", "GATEWAY_SERVER_ASGI_SERVER": "daphne"}
    ).wait()
    try:
        response = await refused(gateway.url.replace("http://", "ws://") + "/v1/responses")
        assert response.status_code == 403
        # Plain HTTP keeps its exact 401 under daphne.
        import httpx

        async with httpx.AsyncClient() as client:
            r = await client.get(f"{gateway.url}/v1/anything")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    finally:
        gateway.stop()
