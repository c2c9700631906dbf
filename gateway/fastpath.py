"""The ASGI fast path: the routes of :mod:`gateway.core.fastroutes`, served below Django.

Chat Completions, Completions, Embeddings, Audio and Anthropic Messages are relayed byte for byte;
going through Django's request/response machinery for them costs more CPU than the relay itself
(measured in ``docs/performance.md``). This app sits directly under ``GatewayASGIMiddleware``
(which opened the request's :class:`gateway.core.pipeline.Passage`: request id, log context, body
ceiling) and serves those paths itself, admitting each request through :func:`gateway.core.pipeline.admitted`
(CORS, authentication, method); ``GatewayASGIMiddleware`` finishes it. Paths an app registered a
handler for (``POST /v1/responses``) go to that handler; every other request, and every CORS
preflight, goes on to Django.

Each pass-through route has exactly one implementation on the ASGI path
(:func:`inference_app.upstream.forward.relay`).
"""

from __future__ import annotations

from typing import Any

from gateway.core import errors, fastroutes
from gateway.core.asgi import Receive, Scope, Send, send_error
from gateway.core.pipeline import admitted, passage_of
from inference_app.upstream.forward import Route, relay

ASGIApp = Any


class FastPathApp:
    """Serve the fast routes directly; hand everything else to ``app`` (Django)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.routes = fastroutes.RELAYED
        self.apps = fastroutes.HANDLERS

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] != "OPTIONS":
            handler = self.apps.get(scope["path"])
            if handler is not None:
                await handler(scope, receive, send)
                return
            route = self.routes.get(scope["path"])
            if route is not None:
                await self.serve(route, scope, receive, send)
                return
        # Everything else, and CORS preflights (answered by django-cors-headers), go to Django.
        await self.app(scope, receive, send)

    async def serve(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        passage = passage_of(scope)
        try:
            auth = await admitted(passage, headers, route.methods)
        except errors.GatewayError as exc:
            await send_error(send, scope, exc, passage.cors)
            return
        scope["principal"] = auth.principal
        await relay(
            route,
            scope,
            receive,
            send,
            credential_consumed=auth.credential_consumed,
            extra_headers=passage.cors,
            headers=headers,
        )
