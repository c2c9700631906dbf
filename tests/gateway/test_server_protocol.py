"""The server protocol `manage.py serve` runs: a sized response leaves in one write, streams as before."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from gateway.server import GatewayHttpProtocol
from tests.servers import LiveServer

WRITES: list[bytes] = []


class _Recorder:
    """The real socket transport, with every write also recorded."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def write(self, data: bytes) -> None:
        WRITES.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class RecordingProtocol(GatewayHttpProtocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(_Recorder(transport))  # type: ignore[arg-type]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    if scope["path"] == "/sized":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"7")]})
        await send({"type": "http.response.body", "body": b'{"a":1}'})
    elif scope["path"] == "/stream":
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        await asyncio.sleep(0.2)
        await send({"type": "http.response.body", "body": b"late", "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    elif scope["path"] == "/sized-in-parts":
        await send({"type": "http.response.start", "status": 201, "headers": [(b"content-length", b"6")]})
        await send({"type": "http.response.body", "body": b"abc", "more_body": True})
        await send({"type": "http.response.body", "body": b"def"})


@pytest.fixture(scope="module")
def server() -> Any:
    live = LiveServer(app, http=RecordingProtocol).start()
    yield live
    live.stop()


def test_a_sized_response_is_written_once(server: LiveServer) -> None:
    WRITES.clear()
    r = httpx.get(f"{server.url}/sized")
    assert r.status_code == 200 and r.content == b'{"a":1}'
    assert len(WRITES) == 1
    assert WRITES[0].startswith(b"HTTP/1.1 200 OK\r\n") and WRITES[0].endswith(b'\r\n\r\n{"a":1}')


def test_a_sized_body_in_parts_carries_the_head_in_its_first_write(server: LiveServer) -> None:
    WRITES.clear()
    r = httpx.get(f"{server.url}/sized-in-parts")
    assert r.status_code == 201 and r.content == b"abcdef"
    assert len(WRITES) == 2
    assert WRITES[0].startswith(b"HTTP/1.1 201 Created\r\n") and WRITES[0].endswith(b"\r\n\r\nabc")
    assert WRITES[1] == b"def"


def test_a_stream_sends_its_head_at_once(server: LiveServer) -> None:
    WRITES.clear()
    with httpx.stream("GET", f"{server.url}/stream") as r:
        # The head arrives before the first body chunk is even produced.
        assert r.status_code == 200
        assert len(WRITES) == 1 and WRITES[0].startswith(b"HTTP/1.1 200 OK\r\n")
        assert WRITES[0].endswith(b"\r\n\r\n")
        assert r.read() == b"late"


def test_head_requests_are_answered_as_uvicorn_answers_them(server: LiveServer) -> None:
    WRITES.clear()
    r = httpx.head(f"{server.url}/sized")
    assert r.status_code == 200 and r.headers["content-length"] == "7" and r.content == b""


def test_the_draining_websocket_protocol_finds_the_uvicorn_internals_it_relies_on() -> None:
    """gateway.server.DrainingWebSocketProtocol overrides uvicorn's shutdown() and reads these."""
    import inspect

    from uvicorn.protocols.websockets.websockets_impl import WebSocketProtocol

    from gateway.server import DrainingWebSocketProtocol

    assert issubclass(DrainingWebSocketProtocol, WebSocketProtocol)
    assert "shutdown" in WebSocketProtocol.__dict__
    init = inspect.getsource(WebSocketProtocol.__init__)
    for attribute in ("self.loop", "self.handshake_completed_event"):
        assert attribute in init, attribute
    assert "self.transport" in inspect.getsource(WebSocketProtocol.connection_made)
