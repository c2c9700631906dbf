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

from gateway.core import errors  # noqa: E402
from gateway.core.auth.websocket import WebSocketAuthMiddleware  # noqa: E402
from gateway.core.lifecycle import lifespan  # noqa: E402
from gateway.core.middleware import GatewayASGIMiddleware  # noqa: E402
from gateway.fastpath import FastPathApp  # noqa: E402
from gateway.routing import websocket_urlpatterns  # noqa: E402
from gateway.site_middleware import SITE_PREFIXES  # noqa: E402

STATIC_PREFIX = "/" + settings.STATIC_URL.lstrip("/")


def static_path_escapes(path: str) -> bool:
    """Whether a ``/static/`` path names something outside the static directories.

    Django's static finders refuse such a path with ``SuspiciousFileOperation``, which
    ``ASGIStaticFilesHandler`` does not turn into a 404: a 500 with a traceback per request.
    """
    relative = posixpath.normpath(path[len(STATIC_PREFIX) :]).lstrip("/")
    return relative == ".." or relative.startswith("../") or "\x00" in relative


class RequestThreads:
    """Each request's own thread for Django's thread-sensitive work, reused from request to request.

    Django's ASGI handler runs every request in a ``ThreadSensitiveContext`` of its own, so that its
    thread-sensitive ``sync_to_async`` calls (the ``request_started`` and ``request_finished``
    receivers, ``response.close()``, a sync view or middleware) never queue behind another request's
    on asgiref's one shared thread. Left to itself such a context starts a thread for its first call
    and, when it ends, one more to join that one: two thread starts per request, measured at about
    half of the CPU time of a conversation retrieve (``docs/performance.md``, issue 20).

    asgiref's documented ``ThreadSensitiveContext(executor=...)`` leaves the executor to its caller
    "for a later block, for example in a pool": a request takes an idle one-thread executor (a new
    one when none is idle) and gives it back when it has ended, so each request still has a thread
    to itself, and no request starts a thread once the pool holds as many as run at once. Django's
    own context inside this one is then a no-op (only the outermost sets the thread). An executor
    whose request did not end normally (cancelled: its thread may still be busy) is not reused.
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
# A request keeps many containers alive while it runs (events, snapshots, rows): at the default
# threshold (700) a stored response cost 54-59 µs of collections under load, nearly all of it gen 0/1
# passes over objects still in use, plus a full collection every ~850 responses. GC_GEN0_THRESHOLD
# lets young objects die by reference count first (docs/performance.md, "Garbage collection"). The
# oldest generation keeps CPython's default (10): Django and DRF leave reference cycles behind every
# request (view <-> request, serializer <-> fields, response <-> renderer context), and some of them
# outlive a young collection; at 100 they piled up for hundreds of thousands of requests before a
# full collection freed them (Conversations under load: +0.6 KB of memory a request, unbounded for
# as long as a soak ran; at 10 it levels off).
GC_GEN0_THRESHOLD = 10_000
GC_OLDEST_THRESHOLD = 10
gc.set_threshold(GC_GEN0_THRESHOLD, 20, GC_OLDEST_THRESHOLD)
