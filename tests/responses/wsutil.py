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


class RawSocketClient:
    """A bare RFC 6455 client on a blocking socket with a tiny receive buffer.

    Unlike library clients, it reads nothing until told to, so the server meets real TCP
    backpressure (client libraries keep reading into their own buffers in the background).
    """

    def __init__(self, port: int, path: str = "/v1/responses") -> None:
        import base64
        import os
        import socket

        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        assert head.startswith(b"HTTP/1.1 101"), head
        self.buffer = b""

    def send_text(self, text: str) -> None:
        import os
        import struct

        payload = text.encode()
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            header = bytes([0x81, 0x80 | n])
        elif n < 65536:
            header = bytes([0x81, 0x80 | 126]) + struct.pack("!H", n)
        else:
            header = bytes([0x81, 0x80 | 127]) + struct.pack("!Q", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(header + mask + masked)

    def read_all(self, timeout: float = 20) -> tuple[list[dict[str, Any]], int | None, str]:
        """Every text frame until the server closes; returns (events, close code, close reason)."""
        import struct

        self.sock.settimeout(timeout)
        data = b""
        while True:
            try:
                chunk = self.sock.recv(1 << 20)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        events: list[dict[str, Any]] = []
        pos = 0
        while pos + 2 <= len(data):
            opcode = data[pos] & 0x0F
            n = data[pos + 1] & 0x7F
            pos += 2
            if n == 126:
                (n,) = struct.unpack("!H", data[pos : pos + 2])
                pos += 2
            elif n == 127:
                (n,) = struct.unpack("!Q", data[pos : pos + 8])
                pos += 8
            if pos + n > len(data):
                break  # a frame cut off by the close
            payload = data[pos : pos + n]
            pos += n
            if opcode == 0x1:
                events.append(orjson.loads(payload))
            elif opcode == 0x8:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
                return events, code, payload[2:].decode()
        return events, None, ""

    def close(self) -> None:
        self.sock.close()
