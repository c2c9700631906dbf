"""ASGI entry point: HTTP to Django, WebSocket to the Channels URL router.

Both go through ``GatewayASGIMiddleware`` (request id, body ceiling, metrics, access log); the
WebSocket upgrade is authenticated by ``WebSocketAuthMiddleware`` before any consumer runs.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")

from django.core.asgi import get_asgi_application

django_app = get_asgi_application()

from typing import Any  # noqa: E402

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from gateway.auth.websocket import WebSocketAuthMiddleware  # noqa: E402
from gateway.middleware import GatewayASGIMiddleware  # noqa: E402
from gateway.routing import websocket_urlpatterns  # noqa: E402


def websocket_app(patterns: list[Any]) -> Any:
    """The WebSocket side: authenticated upgrade, then the Channels URL router."""
    return WebSocketAuthMiddleware(URLRouter(patterns))


application = GatewayASGIMiddleware(
    ProtocolTypeRouter(
        {
            "http": ASGIStaticFilesHandler(django_app),
            "websocket": websocket_app(websocket_urlpatterns),
        }
    )
)
