"""ASGI entry point: HTTP to Django, WebSocket to the Channels URL router.

Everything goes through ``GatewayASGIMiddleware`` (request id, limits, metrics, access log); the
site's middlewares skip the API (``gateway.site_middleware.SiteOnly``). The WebSocket upgrade is
authenticated by ``WebSocketAuthMiddleware`` before any consumer runs.
"""

import gc
import os
import posixpath
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")

from django.core.asgi import get_asgi_application

django_app = get_asgi_application()

from typing import Any  # noqa: E402

from asgiref.sync import ThreadSensitiveContext  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from gateway.core import errors, tracing  # noqa: E402
from gateway.core.auth.websocket import WebSocketAuthMiddleware  # noqa: E402
from gateway.core.config import get_config  # noqa: E402
from gateway.core.lifecycle import lifespan  # noqa: E402
from gateway.core.middleware import GatewayASGIMiddleware  # noqa: E402
from gateway.fastpath import FastPathApp  # noqa: E402
from gateway.routing import websocket_urlpatterns  # noqa: E402
from gateway.site_middleware import SITE_PREFIXES  # noqa: E402

STATIC_PREFIX = "/" + settings.STATIC_URL.lstrip("/")


def static_path_escapes(path: str) -> bool:
    """Whether a ``/static/`` path escapes the static directories (Django's finders raise, which
    ``ASGIStaticFilesHandler`` would answer with a 500)."""
    relative = posixpath.normpath(path[len(STATIC_PREFIX) :]).lstrip("/")
    return relative == ".." or relative.startswith("../") or "\x00" in relative


class RequestThreads:
    """Each API request's own thread for Django's thread-sensitive work, from a pool of one-thread
    executors.

    Django gives every request a ``ThreadSensitiveContext``, which alone starts and joins a thread per
    request; asgiref's documented ``executor=`` argument lets a pool reuse them, so no request queues
    behind another's and none starts a thread once the pool is warm (``docs/performance.md``). An
    executor whose request was cancelled is not reused.
    """

    def __init__(self, keep: int = 64) -> None:
        self.keep = keep  # idle threads kept; more are shut down as their requests end
        self.idle: list[ThreadPoolExecutor] = []

    async def serve(self, app: Any, scope: Any, receive: Any, send: Any) -> None:
        executor = self.idle.pop() if self.idle else ThreadPoolExecutor(1, thread_name_prefix="request")
        try:
            async with ThreadSensitiveContext(executor=executor):
                await app(scope, receive, send)
        except BaseException:
            executor.shutdown(wait=False)  # its thread ends once its work is done
            raise
        if len(self.idle) < self.keep:
            self.idle.append(executor)
        else:
            executor.shutdown(wait=False)


class HttpDispatch:
    """The admin and its SSO with static files; the API and probes on a thread of their own."""

    def __init__(self) -> None:
        self.api = django_app
        self.site = ASGIStaticFilesHandler(django_app)
        self.threads = RequestThreads()

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        path = scope["path"]
        if path.startswith(SITE_PREFIXES):
            if path.startswith(STATIC_PREFIX) and static_path_escapes(path):
                await errors.asgi_send(send, errors.unknown_route(scope["method"], path), scope)
                return
            await self.site(scope, receive, send)
        else:
            await self.threads.serve(self.api, scope, receive, send)


def websocket_app(patterns: list[Any]) -> Any:
    """The WebSocket side: authenticated upgrade, then the Channels URL router."""
    return WebSocketAuthMiddleware(URLRouter(patterns))


# Tracing (the OTEL_* variables) is set up in each server process before it serves; off, the app is
# not wrapped at all.
tracing.setup(get_config())
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
# The server span is outermost: the request id, limits and access log run inside it (pass-through too).
application = tracing.instrument_asgi(application)

# Everything imported so far (Django, the apps, the URLconf) lives as long as the process: move it
# out of the garbage collector's reach, so full collections stay cheap under load.
gc.freeze()
# Young objects die by reference count before a collection (GC_GEN0_THRESHOLD); the oldest generation
# keeps CPython's default, since Django and DRF leave cycles behind each request that would otherwise
# pile up (docs/performance.md, "Garbage collection").
GC_GEN0_THRESHOLD = 10_000
GC_OLDEST_THRESHOLD = 10
gc.set_threshold(GC_GEN0_THRESHOLD, 20, GC_OLDEST_THRESHOLD)
