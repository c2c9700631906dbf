"""``POST /v1/responses`` on the relay's protocol (``gateway.relay.protocol.HandlerCycle``), what
``manage.py serve`` runs: the registered handler under ``GatewayASGIMiddleware``, without uvicorn's
request cycle and the layers above the handler.

The behaviour every Responses client is owed is tested throughout ``tests/responses`` (their
``live_gateway`` is this protocol), and with the relay off too in ``test_routing.py`` and
``test_failures.py`` (``tests/gateway/both_ways.py``). Here: that the handler cycle really is the
path those requests take, what goes to uvicorn's path instead, and what only a cycle of our own has
to get right (pipelined requests, a late body, ``Connection: close``, a disconnect, the log context).
"""

from __future__ import annotations

import socket
import time
from typing import Any

import httpx
import orjson
import pytest
from uvicorn.protocols.http.flow_control import FlowControl

from gateway.fastpath import FastPathApp
from gateway.middleware import GatewayASGIMiddleware
from gateway.relay.protocol import GatewayServerProtocol, HandlerCycle
from responses_app.models import Response
from tests.responses.conftest import Gateway, sse_events
from tests.responses.scripts import Script, handler, text
from tests.servers import access_records, sized_answers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def wire() -> str:
    return "responses"


@pytest.fixture
def paths(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many requests each path took: ``cycle`` (a ``HandlerCycle``) and ``asgi`` (uvicorn's
    cycle, through the ASGI fast path's dispatch)."""
    counts = {"cycle": 0, "asgi": 0}
    run, call = HandlerCycle.run_asgi, FastPathApp.__call__

    async def counting_run(self: HandlerCycle, app: Any) -> None:
        counts["cycle"] += 1
        await run(self, app)

    async def counting_call(self: FastPathApp, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/responses":
            counts["asgi"] += 1
        await call(self, scope, receive, send)

    monkeypatch.setattr(HandlerCycle, "run_asgi", counting_run)
    monkeypatch.setattr(FastPathApp, "__call__", counting_call)
    return counts


@pytest.fixture
def served(gw: Gateway, gateway_config: Any) -> Gateway:
    gateway_config(llm_api_base=gw.upstream.url, upstream_api="responses")
    return gw


def _address(gw: Gateway) -> tuple[str, int]:
    port = httpx.URL(gw.url).port
    assert port is not None
    return "127.0.0.1", port


def _answer(gw: Gateway, *words: str, times: int = 1) -> None:
    for _ in range(times):
        gw.upstream.script("/v1/responses", handler(Script([text(*words)]), "responses"))


def _body(stream: bool = False, **extra: Any) -> bytes:
    return orjson.dumps({"model": "m", "input": "hi", "stream": stream, **extra})


def _request(body: bytes, *headers: bytes) -> bytes:
    extra = b"".join(header + b"\r\n" for header in headers)
    return (
        b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n%b"
        b"content-length: %d\r\n\r\n%b" % (extra, len(body), body)
    )


def test_responses_requests_run_on_the_handler_cycle(
    served: Gateway, paths: dict[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    _answer(served, "Hello", " there", times=3)
    with httpx.Client(base_url=served.url, headers={"content-type": "application/json"}) as client:
        first = client.post("/v1/responses", content=_body())
        streamed = client.post("/v1/responses", content=_body(stream=True))
        third = client.post("/v1/responses?x=1", content=_body(), headers={"x-request-id": "mine-1"})
    assert first.status_code == streamed.status_code == third.status_code == 200
    assert first.json()["output"][0]["content"][0]["text"] == "Hello there"
    assert first.headers["content-length"] == str(len(first.content))
    events = sse_events(streamed)
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    assert streamed.headers["transfer-encoding"] == "chunked"
    assert third.headers["x-request-id"] == "mine-1"
    assert Response.objects.filter(status="completed").count() == 3
    assert paths == {"cycle": 3, "asgi": 0}
    # Each access line carries its request's id, as on every path.
    logged = [r.request_id for r in access_records(caplog, 3)]
    assert logged == [r.headers["x-request-id"] for r in (first, streamed, third)]


def test_what_the_cycle_does_not_take_goes_to_uvicorns_path(served: Gateway, paths: dict[str, int]) -> None:
    _answer(served, "ok", times=2)
    body = _body()

    def pieces() -> Any:
        yield body[:10]
        yield body[10:]

    chunked = httpx.post(
        f"{served.url}/v1/responses", content=pieces(), headers={"content-type": "application/json"}
    )
    assert chunked.status_code == 200 and chunked.json()["status"] == "completed"
    with socket.create_connection(_address(served), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n" % len(body)
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 ")
        sock.sendall(body)
        [answer] = sized_answers(sock, 1)
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert paths == {"cycle": 0, "asgi": 2}


def test_refusals_are_answered_in_the_envelope(
    served: Gateway, gateway_config: Any, paths: dict[str, int]
) -> None:
    gateway_config(auth__require_api_key=True)
    refused = httpx.post(f"{served.url}/v1/responses", content=_body())
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "missing_bearer_token"
    assert refused.headers["www-authenticate"] == "Bearer"
    assert refused.headers["x-request-id"]
    gateway_config(auth__require_api_key=False, server__max_request_body_size_bytes=100)
    too_large = httpx.post(f"{served.url}/v1/responses", content=b"x" * 101)
    assert too_large.status_code == 413
    assert too_large.json()["error"]["code"] == "request_too_large"
    invalid = httpx.post(f"{served.url}/v1/responses", content=b"{")
    assert invalid.status_code == 400
    assert invalid.json()["error"]["type"] == "invalid_request_error"
    assert served.upstream.requests == []
    assert Response.objects.count() == 0
    # A declared length over the ceiling never reaches the cycle: uvicorn's path takes it and the
    # middleware refuses it before any application runs.
    assert paths == {"cycle": 2, "asgi": 0}


def test_pipelined_requests_are_answered_in_order(served: Gateway, paths: dict[str, int]) -> None:
    for word in ("first", "second", "third"):
        _answer(served, word)
    with socket.create_connection(_address(served), timeout=5) as sock:
        sock.sendall(_request(_body()) * 3)  # three requests in one write, before any answer
        answers = sized_answers(sock, 3)
    assert all(answer.startswith(b"HTTP/1.1 200 ") for answer in answers)
    texts = [
        orjson.loads(answer.split(b"\r\n\r\n", 1)[1])["output"][0]["content"][0]["text"] for answer in answers
    ]
    assert texts == ["first", "second", "third"]
    # The first found the connection idle (the handler cycle); uvicorn queued the other two.
    assert paths == {"cycle": 1, "asgi": 2}


def test_connection_close_gets_the_whole_answer_then_the_close(served: Gateway) -> None:
    _answer(served, "x" * 5000)
    with socket.create_connection(_address(served), timeout=5) as sock:
        sock.sendall(_request(_body(), b"connection: close"))
        received = b""
        while chunk := sock.recv(65536):  # until the gateway closes the connection
            received += chunk
    head, _, content = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head.lower()
    assert orjson.loads(content)["output"][0]["content"][0]["text"] == "x" * 5000


def test_a_body_that_comes_too_late_is_answered_408(
    served: Gateway, gateway_config: Any, paths: dict[str, int]
) -> None:
    gateway_config(server__request_read_timeout_s=0.5)
    body = _body()
    with socket.create_connection(_address(served), timeout=5) as sock:
        sock.sendall(_request(body)[: -len(body) // 2])  # the head and half the body
        started = time.monotonic()
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        waited = time.monotonic() - started
    head, _, content = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), received
    assert orjson.loads(content)["error"]["code"] == "request_timeout"
    assert 0.3 < waited < 3, waited
    assert served.upstream.requests == [] and Response.objects.count() == 0
    assert paths == {"cycle": 1, "asgi": 0}


def test_a_client_that_leaves_mid_stream_still_gets_its_response_stored(
    served: Gateway, paths: dict[str, int]
) -> None:
    script = Script([text("a", "b", "c", "d")], delay_s=0.2)
    served.upstream.script("/v1/responses", handler(script, "responses"))
    with socket.create_connection(_address(served), timeout=5) as sock:
        sock.sendall(_request(_body(stream=True)))
        received = b""
        while b"response.created" not in received:
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
    # Closed after the first events: the stored response still runs to its end.
    deadline = time.monotonic() + 10
    while not Response.objects.filter(status="completed").exists():
        assert time.monotonic() < deadline, list(Response.objects.values_list("status", flat=True))
        time.sleep(0.05)
    [stored] = Response.objects.all()
    assert stored.snapshot["output"][0]["content"][0]["text"] == "abcd"
    assert paths == {"cycle": 1, "asgi": 0}


def _until_closed(sock: socket.socket) -> bytes:
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def _dechunk(content: bytes) -> tuple[bytes, bool]:
    """A chunked body's data, and whether its terminating chunk came."""
    data = b""
    while content:
        size_line, _, rest = content.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return data, rest == b"\r\n"
        data, content = data + rest[:size], rest[size + 2 :]
    return data, False


async def _raises_before_answering(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    raise RuntimeError("a bug in the application")


async def _returns_without_answering(scope: Any, receive: Any, send: Any) -> None:
    await receive()


async def _raises_mid_stream(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
    )
    await send({"type": "http.response.body", "body": b"data: first\n\n", "more_body": True})
    raise RuntimeError("a bug in the middle of a stream")


async def _returns_mid_answer(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]})


@pytest.mark.parametrize(
    ("app", "wrapped"),
    [
        (_raises_before_answering, False),
        (_returns_without_answering, False),
        (_returns_without_answering, True),
    ],
)
def test_an_application_that_fails_before_answering_gets_a_500_in_the_envelope_and_a_close(
    served: Gateway, monkeypatch: pytest.MonkeyPatch, paths: dict[str, int], app: Any, wrapped: bool
) -> None:
    """What uvicorn does for an application that fails (a 500, then the close), in our envelope.
    Wrapped in the middleware, an application that raises is answered by the middleware itself;
    one that returns without answering is the cycle's to answer."""
    served_app = GatewayASGIMiddleware(app) if wrapped else app
    monkeypatch.setattr(
        GatewayServerProtocol, "_handled_routes", {b"/v1/responses": ("/v1/responses", served_app)}
    )
    with socket.create_connection(_address(served), timeout=5) as sock:
        sock.sendall(_request(_body()))
        received = _until_closed(sock)  # the gateway closes the connection after the answer
    head, _, content = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 500 "), received
    lines = head.lower().split(b"\r\n")
    assert b"connection: close" in lines and b"content-type: application/json" in lines
    assert b"content-length: %d" % len(content) in lines
    error = orjson.loads(content)["error"]
    assert error["type"] == "server_error" and error["message"]
    assert paths["cycle"] == 1


@pytest.mark.parametrize("app", [_raises_mid_stream, _returns_mid_answer])
def test_an_application_that_fails_mid_answer_has_its_connection_cut(
    served: Gateway, monkeypatch: pytest.MonkeyPatch, paths: dict[str, int], app: Any
) -> None:
    """An answer that has begun cannot become an error: what was sent goes out, then the close
    (the client sees a truncated answer, never a complete one)."""
    monkeypatch.setattr(GatewayServerProtocol, "_handled_routes", {b"/v1/responses": ("/v1/responses", app)})
    with socket.create_connection(_address(served), timeout=5) as sock:
        sock.sendall(_request(_body()))
        received = _until_closed(sock)
    head, _, content = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), received
    if app is _raises_mid_stream:
        assert b"transfer-encoding: chunked" in head.lower().split(b"\r\n")
        assert _dechunk(content) == (b"data: first\n\n", False)  # no terminating chunk
    else:
        assert content == b""  # the head alone: 10 bytes declared, none sent
    assert paths["cycle"] == 1


def test_a_slow_reader_gets_a_long_stream_whole(served: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream larger than every buffer between the gateway and a client that does not read: the
    cycle waits for the socket to drain (uvicorn's flow control) and loses nothing."""
    drains = 0
    drain = FlowControl.drain

    async def counting_drain(self: FlowControl) -> None:
        nonlocal drains
        drains += 1
        await drain(self)

    monkeypatch.setattr(FlowControl, "drain", counting_drain)
    words = [f"{i:04d}" + "w" * 3996 for i in range(300)]  # 1.2 MB of text: ~6 MB of events
    _answer(served, *words)
    with socket.create_connection(_address(served), timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.sendall(_request(_body(stream=True)))
        time.sleep(1.0)  # not reading: the gateway's writes back up
        received = bytearray()
        while not received.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(1 << 20)
            assert chunk, received[-200:]
            received += chunk
    head, _, content = bytes(received).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    data, terminated = _dechunk(content)
    assert terminated
    events = [orjson.loads(line[6:]) for line in data.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1]["type"] == "response.completed"
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas == words
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "".join(words)
    assert drains > 0  # the writes really waited for the client
