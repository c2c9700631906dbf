"""The server protocol `manage.py serve` runs: what one loop iteration produces leaves in one write
(a sized response whole; a stream's head at once, its last chunk with the terminator)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
import orjson
import pytest

from gateway.relay.protocol import (
    GatewayHttpProtocol,
)
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
        if scope["query_string"] == b"wait":
            await asyncio.sleep(0.05)
        await send({"type": "http.response.body", "body": b"def"})
    elif scope["path"] == "/stream-together":
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b", "more_body": True})
        await send({"type": "http.response.body", "body": b""})


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


def test_a_sized_body_in_parts_produced_together_is_one_write(server: LiveServer) -> None:
    WRITES.clear()
    r = httpx.get(f"{server.url}/sized-in-parts")
    assert r.status_code == 201 and r.content == b"abcdef"
    assert len(WRITES) == 1
    assert WRITES[0].startswith(b"HTTP/1.1 201 Created\r\n") and WRITES[0].endswith(b"\r\n\r\nabcdef")


def test_a_sized_body_in_parts_carries_the_head_in_its_first_write(server: LiveServer) -> None:
    WRITES.clear()
    r = httpx.get(f"{server.url}/sized-in-parts?wait")
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
    # The last chunk and the chunked terminator, sent in one iteration, leave in one write.
    assert WRITES[1:] == [b"4\r\nlate\r\n0\r\n\r\n"]


def test_a_stream_produced_in_one_iteration_is_one_write(server: LiveServer) -> None:
    WRITES.clear()
    r = httpx.get(f"{server.url}/stream-together")
    assert r.status_code == 200 and r.content == b"ab"
    assert len(WRITES) == 1
    assert WRITES[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert WRITES[0].endswith(b"\r\n\r\n1\r\na\r\n1\r\nb\r\n0\r\n\r\n")


def test_head_requests_are_answered_as_uvicorn_answers_them(server: LiveServer) -> None:
    WRITES.clear()
    r = httpx.head(f"{server.url}/sized")
    assert r.status_code == 200 and r.headers["content-length"] == "7" and r.content == b""


def test_a_refused_request_is_answered_in_the_envelope(server: LiveServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"FOO / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"\r\nconnection: close" in head and b"\r\nx-request-id: req_" in head
    assert orjson.loads(body) == {
        "error": {
            "message": "Invalid HTTP request received.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_http_request",
        }
    }
