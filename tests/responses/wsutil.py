"""A small raw WebSocket client for the ``WS /v1/responses`` tests."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import websockets
from websockets.asyncio.client import ClientConnection

TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}


def ws_url(http_url: str) -> str:
    return http_url.replace("http://", "ws://") + "/v1/responses"


def create(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "response.create", "model": "test-model", "input": "hi"}
    body.update(fields)
    return body


class Client:
    """Sends client events and collects server events per ``stream_id`` (with arrival times)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.times: list[float] = []

    async def send(self, event: dict[str, Any] | str) -> None:
        await self.ws.send(event if isinstance(event, str) else orjson.dumps(event).decode())

    async def recv(self, timeout: float = 10) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.ws.recv(), timeout)
        event = orjson.loads(raw)
        self.events.append(event)
        self.times.append(time.monotonic())
        return event

    async def until_terminal(self, count: int = 1, timeout: float = 15) -> list[dict[str, Any]]:
        """Receive until ``count`` terminal events (any lane) arrived; returns what was received."""
        got: list[dict[str, Any]] = []
        seen = 0
        while seen < count:
            event = await self.recv(timeout)
            got.append(event)
            if event["type"] in TERMINAL:
                seen += 1
        return got

    async def nothing_more(self, wait: float = 0.5) -> None:
        try:
            event = await asyncio.wait_for(self.ws.recv(), wait)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected event {event!r}")


def lane(events: list[dict[str, Any]], stream_id: str | None) -> list[dict[str, Any]]:
    return [e for e in events if e.get("stream_id") == stream_id]


async def connect(http_url: str, **options: Any) -> ClientConnection:
    return await websockets.connect(ws_url(http_url), max_size=None, **options)
