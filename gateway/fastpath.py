"""The ASGI fast path for the pure pass-through routes.

Chat Completions, Completions, Embeddings, Audio and Anthropic Messages are relayed byte for byte;
going through Django's request/response machinery for them costs more CPU than the relay itself
(measured in ``docs/performance.md``). This app sits directly under ``GatewayASGIMiddleware`` (so
the request id, body ceiling, metrics and access log still apply) and serves those paths itself;
every other request, and every CORS preflight, goes on to Django.

Each route has exactly one implementation (:func:`gateway.passthrough.relay`); this module only
dispatches, authenticates through the framework-agnostic ``gateway.auth.authenticate`` and adds
the CORS headers django-cors-headers would add, computed by that library itself.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from corsheaders.conf import conf
from django.core.signals import setting_changed
from django.dispatch import receiver

from gateway import errors
from gateway.passthrough import ROUTES as PASSTHROUGH_ROUTES
from gateway.passthrough import RawHeaders, Receive, Route, Scope, Send, relay, send_error

ASGIApp = Any


def fast_routes() -> dict[str, Route]:
    from gateway.messages import ROUTES as MESSAGES_ROUTES

    return {**PASSTHROUGH_ROUTES, **MESSAGES_ROUTES}


def app_routes() -> dict[str, ASGIApp]:
    """Routes an app serves with its own ASGI handler (auth, CORS and errors done there)."""
    from responses_app.fastpath import ROUTES as RESPONSES_ROUTES

    return dict(RESPONSES_ROUTES)


@lru_cache(maxsize=256)
def _cors_applies(pattern: Any, path: str) -> bool:
    return re.match(pattern, path) is not None


_urls_regex: Any = None  # CORS_URLS_REGEX, read once (a settings lookup per request is measurable)


def _cors_urls_regex() -> Any:
    global _urls_regex
    if _urls_regex is None:
        _urls_regex = conf.CORS_URLS_REGEX
    return _urls_regex


@receiver(setting_changed)
def _forget_cors_urls_regex(setting: str, **kwargs: Any) -> None:
    global _urls_regex
    if setting == "CORS_URLS_REGEX":
        _urls_regex = None


_NO_HEADERS: RawHeaders = []
_VARY_ORIGIN: RawHeaders = [(b"vary", b"origin")]


def cors_headers(scope: Scope, origin: bytes | None) -> RawHeaders:
    """The headers ``corsheaders.middleware.CorsMiddleware`` adds to a non-preflight response.

    The list returned is shared: callers copy it, never change it.
    """
    path = scope["path"]
    if not _cors_applies(_cors_urls_regex(), path):
        return _NO_HEADERS
    if origin is None:
        return _VARY_ORIGIN
    # A browser request: let the library decide exactly as it does for Django views.
    from corsheaders.middleware import CorsMiddleware
    from django.http import HttpRequest, HttpResponse

    request = HttpRequest()
    request.method = scope["method"]
    request.path = request.path_info = path
    request.META = {
        "HTTP_" + key.decode("latin-1").upper().replace("-", "_"): value.decode("latin-1")
        for key, value in scope["headers"]
    }
    response = HttpResponse()
    del response["Content-Type"]
    CorsMiddleware(lambda r: response).add_response_headers(request, response)
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()]


class FastPathApp:
    """Serve the pass-through routes directly; hand everything else to ``app`` (Django)."""

    def __init__(self, app: ASGIApp) -> None:
        from gateway.auth import authenticate

        self.app = app
        self.routes = fast_routes()
        self.authenticate = authenticate
        self.apps = app_routes()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] != "OPTIONS":
            handler = self.apps.get(scope["path"])
            if handler is not None:
                await handler(scope, receive, send)
                return
        route = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if route is None or scope["method"] == "OPTIONS":
            # Everything else, and CORS preflights (answered by django-cors-headers), go to Django.
            await self.app(scope, receive, send)
            return
        await self.serve(route, scope, receive, send)

    async def serve(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        origin = headers.get("origin")
        extra = cors_headers(scope, origin.encode("latin-1") if origin is not None else None)
        if scope["method"] not in route.methods:
            exc = errors.MethodNotAllowed(
                f"Method {scope['method']} is not allowed on {scope['path']}.",
                headers={"Allow": ", ".join(sorted(route.methods))},
            )
            await send_error(send, scope, exc, extra)
            return
        try:
            auth = await self.authenticate(scope["path"], headers)
        except (errors.AuthenticationFailed, errors.ServiceUnavailable) as exc:
            await send_error(send, scope, exc, extra)
            return
        scope["principal"] = auth.principal
        await relay(
            route,
            scope,
            receive,
            send,
            credential_consumed=auth.credential_consumed,
            extra_headers=extra,
            headers=headers,
        )
