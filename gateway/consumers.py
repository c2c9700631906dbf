"""A placeholder WebSocket consumer on /v1/responses until the Responses transport lands."""

from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from gateway import errors


class PlaceholderResponsesConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    """Accepts, answers every event with a 501 error event, and closes cleanly."""

    async def connect(self) -> None:
        await self.accept()

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        stream_id = content.get("stream_id") if isinstance(content, dict) else None
        exc = errors.NotImplementedFeature("The WebSocket transport for /v1/responses is not available yet.")
        await self.send_json(errors.ws_error_event(exc, stream_id if isinstance(stream_id, str) else None))
        await self.close(code=1000)
