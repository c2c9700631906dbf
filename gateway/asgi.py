"""ASGI entry point: HTTP to Django, WebSocket to the Channels URL router.

Everything goes through ``GatewayASGIMiddleware`` (request id, body ceiling, metrics, access log).
``/v1/*`` is served by a Django handler with the lean, fully async API middleware stack
(``settings.MIDDLEWARE`` minus ``ADMIN_ONLY_MIDDLEWARE``, ``gateway.compat.django``); the admin and
the rest get the full stack with sessions and CSRF.
The WebSocket upgrade is authenticated by ``WebSocketAuthMiddleware`` before any consumer runs.
"""

import gc
import os
import posixpath

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")

from django.core.asgi import get_asgi_application

django_app = get_asgi_application()

from typing import Any  # noqa: E402

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from gateway import errors  # noqa: E402
from gateway.auth.websocket import WebSocketAuthMiddleware  # noqa: E402
from gateway.compat.django import api_handler  # noqa: E402
from gateway.fastpath import FastPathApp  # noqa: E402
from gateway.lifecycle import lifespan  # noqa: E402
from gateway.middleware import GatewayASGIMiddleware  # noqa: E402
from gateway.routing import websocket_urlpatterns  # noqa: E402

# Browser-facing paths that need sessions, CSRF and static files; everything else (the API,
# /health, /ready, /metrics, HEAD /) takes the lean API handler.
SITE_PREFIXES = ("/admin", "/oidc/", "/static/")


STATIC_PREFIX = "/" + settings.STATIC_URL.lstrip("/")


def static_path_escapes(path: str) -> bool:
    """Whether a ``/static/`` path names something outside the static directories.

    Django's static finders refuse such a path with ``SuspiciousFileOperation``, which
    ``ASGIStaticFilesHandler`` does not turn into a 404: a 500 with a traceback per request.
    """
    relative = posixpath.normpath(path[len(STATIC_PREFIX) :]).lstrip("/")
    return relative == ".." or relative.startswith("../") or "\x00" in relative


class HttpDispatch:
    """The admin and its SSO to the full Django stack; the API and probes to the API handler."""

    def __init__(self) -> None:
        self.api = api_handler()  # the API middleware stack (gateway.compat.django)
        self.site = ASGIStaticFilesHandler(django_app)

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        path = scope["path"]
        if path.startswith(SITE_PREFIXES):
            if path.startswith(STATIC_PREFIX) and static_path_escapes(path):
                await errors.asgi_send(send, errors.unknown_route(scope["method"], path), scope)
                return
            await self.site(scope, receive, send)
        else:
            await self.api(scope, receive, send)


def websocket_app(patterns: list[Any]) -> Any:
    """The WebSocket side: authenticated upgrade, then the Channels URL router."""
    return WebSocketAuthMiddleware(URLRouter(patterns))


application = GatewayASGIMiddleware(
    ProtocolTypeRouter(
        {
            # The pure pass-through routes are served below Django (see gateway/fastpath.py).
            "http": FastPathApp(HttpDispatch()),
            "websocket": websocket_app(websocket_urlpatterns),
            # Periodic jobs (the lease sweep) and the end of in-process work at shutdown.
            "lifespan": lifespan,
        }
    )
)

# Everything imported so far (Django, the apps, the URLconf) lives as long as the process: move it
# out of the garbage collector's reach, so full collections stay cheap under load.
gc.freeze()
