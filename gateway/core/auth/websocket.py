"""WebSocket authentication: the upgrade check and the per-message expiry check.

:class:`WebSocketAuthMiddleware` authenticates the upgrade like HTTP, before any consumer runs. A
refusal is a real HTTP 401/503 where the server has ``websocket.http.response`` (uvicorn), else a
close before accept (daphne: 403). Accepted, the scope holds ``principal``, ``credential_consumed``
and ``auth_expires_at``; consumers call :func:`ensure_not_expired` before each new response.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.core import errors
from gateway.core.auth import authenticate, requires_auth
from gateway.core.principal import scope_principal

log = logging.getLogger("gateway.core.auth")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# RFC 6455 "policy violation": the close code used when the server cannot answer an HTTP 401.
WS_CLOSE_POLICY_VIOLATION = 1008
HTTP_RESPONSE_EXTENSION = "websocket.http.response"


def scope_headers(scope: Scope) -> dict[str, str]:
    """Lower-cased request headers of an ASGI scope (the first value of a repeated header wins)."""
    headers: dict[str, str] = {}
    for raw_key, raw_value in scope.get("headers", ()):
        key = raw_key.decode("latin-1").lower()
        headers.setdefault(key, raw_value.decode("latin-1"))
    return headers


class WebSocketAuthMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket" or not requires_auth(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        try:
            result = await authenticate(scope["path"], scope_headers(scope))
        except errors.GatewayError as exc:
            await refuse(scope, receive, send, exc)
            return
        scope = dict(scope)
        scope["principal"] = result.principal
        scope["credential_consumed"] = result.credential_consumed
        scope["auth_expires_at"] = result.principal.expires_at
        await self.app(scope, receive, send)


async def refuse(scope: Scope, receive: Receive, send: Send, exc: errors.GatewayError) -> None:
    """Refuse a WebSocket upgrade before accept, with an HTTP answer when the server allows it."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return  # the client went away already
    if HTTP_RESPONSE_EXTENSION in (scope.get("extensions") or {}):
        status, body, headers = errors.render(exc, scope.get("path", ""), scope.get("gateway.request_id"))
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        raw.append((b"content-length", str(len(body)).encode()))
        await send({"type": "websocket.http.response.start", "status": status, "headers": raw})
        await send({"type": "websocket.http.response.body", "body": body, "more_body": False})
    else:
        await send({"type": "websocket.close", "code": WS_CLOSE_POLICY_VIOLATION})


def ensure_not_expired(scope: Scope, now: float | None = None) -> None:
    """Raise ``AuthenticationFailed`` (``invalid_token``) once the connection's token is past its
    ``exp`` (no leeway here); credentials without expiry never expire."""
    expires_at = scope_principal(scope).expires_at
    if expires_at is None:
        return
    if (time.time() if now is None else now) >= expires_at:
        raise errors.AuthenticationFailed(code="invalid_token")
