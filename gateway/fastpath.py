"""The ASGI fast path: the routes of :mod:`gateway.core.fastroutes`, served below Django.

Pass-through routes are relayed byte for byte (:func:`inference_app.upstream.forward.relay`), since
Django's request cycle costs more than the relay (``docs/performance.md``). Requests are admitted by
:func:`gateway.core.pipeline.admitted`; registered handlers (``POST /v1/responses``) get their
path; everything else, and every CORS preflight, goes on to Django.
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
            auth = await admitted(passage, headers, route.methods, metered=True)
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
