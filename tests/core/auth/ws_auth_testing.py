"""A minimal authenticated WebSocket consumer for the auth tests (the real one is a later issue).

``{"type": "response.create", "stream_id": …}`` answers ``{"type": "ok", "owner": …}`` at once, or,
with ``"delay": s``, ``{"type": "queued"}`` and later ``ok`` — checking the token's expiry both when
the message arrives and again when the queued work starts, as the Responses consumer must.
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.routing import ProtocolTypeRouter
from django.urls import path

from gateway.asgi import websocket_app
from gateway.core import errors
from gateway.core.auth.websocket import ensure_not_expired
from gateway.core.middleware import GatewayASGIMiddleware
from gateway.core.principal import scope_principal


class AuthProbeConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    async def connect(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()
        await self.accept()

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        stream_id = content.get("stream_id")
        try:
            ensure_not_expired(self.scope)
        except errors.GatewayError as exc:
            await self.send_json(errors.ws_error_event(exc, stream_id))
            return
        delay = content.get("delay")
        if delay:
            await self.send_json({"type": "queued", "stream_id": stream_id})
            task = asyncio.create_task(self.run_later(float(delay), stream_id))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            return
        await self.send_json(
            {"type": "ok", "stream_id": stream_id, "owner": scope_principal(self.scope).owner}
        )

    async def run_later(self, delay: float, stream_id: str | None) -> None:
        await asyncio.sleep(delay)
        try:
            ensure_not_expired(self.scope)  # queued work is checked again when it starts
        except errors.GatewayError as exc:
            await self.send_json(errors.ws_error_event(exc, stream_id))
            return
        await self.send_json(
            {"type": "ok", "stream_id": stream_id, "owner": scope_principal(self.scope).owner}
        )


application = GatewayASGIMiddleware(
    ProtocolTypeRouter({"websocket": websocket_app([path("v1/test/ws", AuthProbeConsumer.as_asgi())])})
)
