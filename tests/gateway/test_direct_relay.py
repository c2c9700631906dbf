"""The pass-through relay on callbacks (``gateway.relay.callbacks.Relay``), what ``manage.py serve`` runs.

The behaviour every pass-through route owes its clients is tested in ``test_passthrough.py`` and
``test_messages.py``, with the relay on and off (see ``both_ways.py``). Here: that the callback
relay really is the path those requests take, what it hands to the ASGI fast path instead, and what
only a relay without a task per request has to get right itself (pipelined requests, a slow reader,
a pooled connection the upstream closed as the request went out, the log context).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
from aiohttp import web

from gateway.fastpath import FastPathApp
from gateway.logging import request_id_var
from gateway.relay import callbacks
from gateway.relay.http_client import _BODY, Connection, HttpPool
from gateway.relay.protocol import GatewayServerProtocol, LeanCycle
from tests.servers import LiveServer, access_records, free_port, sized_answers, wait_port
from tests.upstream import (
    DONE,
    Gate,
    Recorded,
    ScriptedUpstream,
    chat_chunks,
    chat_completion,
    json_answer,
    sse,
    sse_data,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def gw(live_gateway: LiveServer, upstream: ScriptedUpstream, gateway_config: Any) -> LiveServer:
    gateway_config(llm_api_base=upstream.url)
    return live_gateway


@pytest.fixture
def paths(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many requests each path took: ``relay`` (callbacks) and ``asgi`` (the ASGI fast path);
    ``lean``: how many of the relayed ones ran on a ``LeanCycle`` (not uvicorn's request cycle)."""
    counts = {"relay": 0, "asgi": 0, "lean": 0}
    relay_init, serve = callbacks.Relay.__init__, FastPathApp.serve

    def counting_init(self: callbacks.Relay, *args: Any) -> None:
        counts["relay"] += 1
        counts["lean"] += isinstance(args[1], LeanCycle)
        relay_init(self, *args)

    async def counting_serve(self: FastPathApp, *args: Any) -> None:
        counts["asgi"] += 1
        await serve(self, *args)

    monkeypatch.setattr(callbacks.Relay, "__init__", counting_init)
    monkeypatch.setattr(FastPathApp, "serve", counting_serve)
    return counts


def chat(stream: bool = False) -> bytes:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


def test_passthrough_requests_take_the_callback_relay(
    gw: LiveServer, upstream: ScriptedUpstream, paths: dict[str, int], caplog: pytest.LogCaptureFixture
) -> None:
    answer = chat_completion("Hello!")
    events = chat_chunks(["Hel", "lo"])
    upstream.script("/v1/chat/completions", json_answer(answer))
    upstream.script("/v1/chat/completions", sse(events))
    upstream.script("/v1/chat/completions", json_answer(answer))
    with httpx.Client(base_url=gw.url, headers={"content-type": "application/json"}) as client:
        # The first request finds no API-key snapshot yet: its authentication runs in a short task,
        # the rest of it on callbacks. The second finds a new upstream connection to open.
        first = client.post("/v1/chat/completions", content=chat())
        streamed = client.post("/v1/chat/completions", content=chat(stream=True))
        third = client.post("/v1/chat/completions", content=chat())
    assert first.status_code == streamed.status_code == third.status_code == 200
    assert first.json() == third.json() == answer
    assert streamed.content == b"".join(events)
    assert first.headers["x-request-id"] != third.headers["x-request-id"]
    assert paths == {"relay": 3, "asgi": 0, "lean": 3}
    # Each access line carries its request's id.
    logged = [r.request_id for r in access_records(caplog, 3)]
    assert logged == [r.headers["x-request-id"] for r in (first, streamed, third)]


def test_a_chunked_request_body_takes_the_asgi_fast_path(
    gw: LiveServer, upstream: ScriptedUpstream, paths: dict[str, int]
) -> None:
    upstream.script("/v1/chat/completions", json_answer(chat_completion("ok")))
    body = chat()

    def pieces() -> Iterator[bytes]:
        yield body[:10]
        yield body[10:]

    response = httpx.post(
        f"{gw.url}/v1/chat/completions", content=pieces(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 200
    assert upstream.last().body == body
    assert paths == {"relay": 0, "asgi": 1, "lean": 0}


def test_refusals_are_answered_by_the_relay(
    gw: LiveServer, upstream: ScriptedUpstream, gateway_config: Any, paths: dict[str, int]
) -> None:
    gateway_config(server__max_request_body_size_bytes=100)
    too_large = httpx.post(f"{gw.url}/v1/chat/completions", content=b"x" * 101)
    assert too_large.status_code == 413
    assert too_large.json()["error"]["code"] == "request_too_large"
    assert too_large.headers["connection"] == "close"
    gateway_config(auth__require_api_key=True)
    refused = httpx.post(f"{gw.url}/v1/chat/completions", content=chat())
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "missing_bearer_token"
    assert refused.headers["www-authenticate"] == "Bearer"
    assert upstream.requests == []
    assert paths == {"relay": 2, "asgi": 0, "lean": 2}


def test_pipelined_requests_are_answered_in_order(
    gw: LiveServer, upstream: ScriptedUpstream, paths: dict[str, int]
) -> None:
    for text in ("first", "second", "third"):
        upstream.script("/v1/chat/completions", json_answer(chat_completion(text)))
    body = chat()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%b" % (len(body), body)
    )
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
        sock.sendall(request * 3)  # three requests in one write, before any answer
        answers = sized_answers(sock, 3)
    assert all(answer.startswith(b"HTTP/1.1 200 ") for answer in answers)
    texts = [
        orjson.loads(answer.split(b"\r\n\r\n", 1)[1])["choices"][0]["message"]["content"]
        for answer in answers
    ]
    assert texts == ["first", "second", "third"]
    # The first found the connection idle (a lean cycle); uvicorn queued the other two.
    assert paths == {"relay": 3, "asgi": 0, "lean": 1}


def test_a_slow_reader_stops_the_upstream_being_read(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    """A client that does not read holds the stream back; nothing is lost once it reads again."""
    event = sse_data({"pad": "x" * 8000})
    count = 8000  # ~64 MB: far more than the sockets' buffers and the pool's high-water mark hold
    written: list[int] = [0]

    async def big_stream(request: web.Request, rec: Recorded) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        response.content_type = "text/event-stream"
        await response.prepare(request)
        for _ in range(count):
            await response.write(event)
            written[0] += 1
        await response.write(DONE)
        await response.write_eof()
        return response

    upstream.script("/v1/chat/completions", big_stream)
    url = f"{gw.url}/v1/chat/completions"
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", url, content=chat(stream=True)) as response,
    ):
        assert response.status_code == 200
        # Read nothing: the gateway must pause reading the upstream (waited for, bounded).
        deadline = time.monotonic() + 10
        while True:
            streaming = [c for c in _upstream_connections() if not c.lost and c.phase == _BODY]
            if len(streaming) == 1 and streaming[0].reading_paused:
                break
            assert time.monotonic() < deadline, "the gateway never paused reading the upstream"
            time.sleep(0.02)
        assert written[0] < count / 2, written[0]  # the upstream is held back, not buffered whole
        received = b"".join(response.iter_raw())
    assert received == event * count + DONE
    assert written[0] == count


def _upstream_connections() -> list[Any]:
    return [obj for obj in gc.get_objects() if isinstance(obj, Connection)]


def _upstream_pools() -> list[Any]:
    return [obj for obj in gc.get_objects() if isinstance(obj, HttpPool)]


def _nobody_waits(pool: Any) -> bool:
    """No live wait for a connection of ``pool`` (a cancelled one stays in its queue, done)."""
    return all(waiter.done() for waiter in pool.waiters)


def _wait_for_pools(url: str, condition: Callable[[Any], bool], what: str) -> None:
    """Wait until ``condition`` holds for every pool of connections to ``url`` (their waiters, their
    idle connections), at most 10 s."""
    port = urlsplit(url).port
    deadline = time.monotonic() + 10
    while True:
        pools = [pool for pool in _upstream_pools() if pool.port == port]
        if pools and all(condition(pool) for pool in pools):
            return
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


class _ClosingUpstream:
    """A raw HTTP/1.1 upstream that answers the first request on each connection and closes the
    connection, without a word, when a second request arrives on it: what an upstream closing an
    idle keep-alive connection looks like to a client that sent on it at that moment."""

    def __init__(self) -> None:
        self.port = free_port()
        self.answered = 0
        self.dropped = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port))
        self.server = server
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered_here = False
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                if answered_here:
                    self.dropped += 1
                    writer.transport.abort()
                    return
                body = orjson.dumps(chat_completion(f"answer {self.answered}"))
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
                    % (len(body), body)
                )
                await writer.drain()
                self.answered += 1
                answered_here = True
        except (asyncio.IncompleteReadError, ConnectionError):
            return

    def start(self) -> _ClosingUpstream:
        self.thread.start()
        wait_port(self.port)
        return self

    def stop(self) -> None:
        async def shutdown() -> None:
            self.server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def test_a_pooled_connection_closed_as_the_request_went_out_is_retried_once(
    live_gateway: LiveServer, gateway_config: Any, paths: dict[str, int]
) -> None:
    closing = _ClosingUpstream().start()
    try:
        gateway_config(llm_api_base=f"http://127.0.0.1:{closing.port}")
        with httpx.Client(base_url=live_gateway.url) as client:
            first = client.post("/v1/chat/completions", content=chat())
            second = client.post("/v1/chat/completions", content=chat())
    finally:
        closing.stop()
    assert first.status_code == second.status_code == 200
    assert second.json()["choices"][0]["message"]["content"] == "answer 1"
    # The second request was dropped on the pooled connection, then sent again on a new one.
    assert (closing.answered, closing.dropped) == (2, 1)
    assert paths["relay"] == 2 and paths["asgi"] == 0


def test_connection_close_gets_the_whole_answer_first(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    """The relay's writes wait in the outbox; closing the connection sends them first."""
    answer = chat_completion("x" * 5000)
    upstream.script("/v1/chat/completions", json_answer(answer))
    body = chat()
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n%b" % (len(body), body)
        )
        received = b""
        while chunk := sock.recv(65536):  # until the gateway closes the connection
            received += chunk
    head, _, content = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head.lower()
    assert orjson.loads(content) == answer


@pytest.fixture
def short_keep_alive(
    upstream: ScriptedUpstream, gateway_config: Any, transactional_db: None
) -> Iterator[LiveServer]:
    from gateway.asgi import application
    from inference_app.upstream import close_upstreams

    gateway_config(llm_api_base=upstream.url)
    server = LiveServer(
        application, on_stop=close_upstreams, http=GatewayServerProtocol, timeout_keep_alive=0.5
    ).start()
    yield server
    server.stop()


def _exchange(sock: socket.socket) -> bytes:
    body = chat()
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)
    )
    return _json_answer(sock)


def _json_answer(sock: socket.socket) -> bytes:
    """One answer with a sized body, read up to its declared length (the connection stays open)."""
    [answer] = sized_answers(sock, 1)
    return answer


def _closed_after(sock: socket.socket, limit: float) -> float:
    """Seconds until the gateway closes ``sock`` (reading nothing else)."""
    started = time.monotonic()
    sock.settimeout(limit)
    assert sock.recv(1) == b""
    return time.monotonic() - started


def test_keep_alive_timeout_counts_from_the_last_answer(
    short_keep_alive: LiveServer, upstream: ScriptedUpstream
) -> None:
    """One timer per connection, re-armed when it fires: an idle connection closes the keep-alive
    timeout after its last answer, not after its first, and not while a request is arriving."""
    for _ in range(4):
        upstream.script("/v1/chat/completions", json_answer(chat_completion("ok")))
    with socket.create_connection(("127.0.0.1", short_keep_alive.port), timeout=5) as sock:
        assert _exchange(sock).startswith(b"HTTP/1.1 200")
        time.sleep(0.35)  # the first answer's timer fires at 0.5 s, into the second answer's idle time
        assert _exchange(sock).startswith(b"HTTP/1.1 200")
        idle = _closed_after(sock, 3)
    assert 0.3 <= idle < 1.5, idle  # closing on the first answer's timer would be ~0.15 s

    with socket.create_connection(("127.0.0.1", short_keep_alive.port), timeout=5) as sock:
        assert _exchange(sock).startswith(b"HTTP/1.1 200")
        # Half a request, then nothing for three timeouts: busy, as uvicorn's own timer treats it.
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        time.sleep(1.5)
        body = chat()
        sock.sendall(b"content-length: %d\r\n\r\n%b" % (len(body), body))
        received = _json_answer(sock)
        assert received.startswith(b"HTTP/1.1 200")
        idle = _closed_after(sock, 3)
    assert 0.3 <= idle < 1.5, idle  # the keep-alive timeout after this answer


def test_a_stream_longer_than_the_keep_alive_timeout_is_not_cut(
    short_keep_alive: LiveServer, upstream: ScriptedUpstream
) -> None:
    """The timer armed by the first answer fires while the second is streaming: it leaves it alone."""
    upstream.script("/v1/chat/completions", json_answer(chat_completion("ok")))
    events = chat_chunks(["a", "b", "c", "d", "e", "f"])
    upstream.script("/v1/chat/completions", sse(events, delay=0.2))  # ~1.2 s, the timeout is 0.5 s
    with socket.create_connection(("127.0.0.1", short_keep_alive.port), timeout=5) as sock:
        assert _exchange(sock).startswith(b"HTTP/1.1 200")
        body = chat(stream=True)
        # The answer's head ends with its x-request-id: with this one, in "0\r\n\r\n" as the
        # stream's last chunk does (a random id ends in 0 one time in sixteen).
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-request-id: stream-10\r\n"
            b"content-length: %d\r\n\r\n%b" % (len(body), body)
        )
        received = b""
        while not received.endswith(b"\r\n0\r\n\r\n"):  # the stream's last chunk
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
    assert received.startswith(b"HTTP/1.1 200")
    assert all(event in received for event in events), received


def test_a_body_arriving_in_pieces_is_relayed_whole(
    gw: LiveServer, upstream: ScriptedUpstream, paths: dict[str, int]
) -> None:
    upstream.script("/v1/embeddings", json_answer({"object": "list", "data": []}))
    body = orjson.dumps({"model": "m", "input": ["x" * 300_000, "y" * 300_000, "z" * 10]})
    pieces = [body[:200_000], body[200_000:400_000], body[400_000:]]
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock:
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body))
        for piece in pieces:
            time.sleep(0.05)  # each piece its own read on the gateway's side
            sock.sendall(piece)
        received = _json_answer(sock)
    assert received.startswith(b"HTTP/1.1 200")
    assert upstream.last().body == body
    assert paths == {"relay": 1, "asgi": 0, "lean": 1}


def test_a_relayed_answer_goes_out_before_its_metrics_and_access_log(
    gw: LiveServer,
    upstream: ScriptedUpstream,
    paths: dict[str, int],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The book-keeping of an answered request (``pipeline.finish``) runs once its bytes are written,
    not between them and the client: with one request in flight it would add to every answer's
    latency."""
    held: list[int] = []
    finish = callbacks.finish

    def recording_finish(*args: Any) -> None:
        held.append(sum(len(pool.outbox.items) for pool in _upstream_pools()))
        finish(*args)

    monkeypatch.setattr(callbacks, "finish", recording_finish)
    answer = chat_completion("Hello!")
    upstream.script("/v1/chat/completions", json_answer(answer))
    upstream.script("/v1/chat/completions", sse(chat_chunks(["Hel", "lo"])))
    with httpx.Client(base_url=gw.url, headers={"content-type": "application/json"}) as client:
        before = _answered(client.get("/metrics").text)
        first = client.post("/v1/chat/completions", content=chat())
        streamed = client.post("/v1/chat/completions", content=chat(stream=True))
        after = _answered(client.get("/metrics").text)
    assert first.json() == answer and streamed.status_code == 200
    assert paths["relay"] == 2
    assert held == [0, 0]  # each finished with nothing of its answer still held
    assert after - before == 2  # and still counted, before the next request was served
    logged = [r.request_id for r in caplog.records if r.name == "gateway.access" and r.route != "/metrics"]  # type: ignore[attr-defined]
    assert logged == [first.headers["x-request-id"], streamed.headers["x-request-id"]]  # and logged


def _answered(metrics: str) -> float:
    """``gateway_http_requests_total`` of chat completions answered 200, from a /metrics page."""
    for line in metrics.splitlines():
        if line.startswith("gateway_http_requests_total{") and all(
            label in line for label in ('route="/v1/chat/completions"', 'method="POST"', 'status="200"')
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class _ContextRecorder(logging.Handler):
    """Keeps each record of the ``gateway`` logger with the log context (request id) it was made in."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.getMessage(), request_id_var.get()))


def test_the_relays_log_lines_carry_the_request_id(
    gw: LiveServer, upstream: ScriptedUpstream, paths: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each step of a relayed request runs in its log context, also when it runs in a task (the first
    request's authentication waits for the key snapshot) and on callbacks (the second's)."""

    def broken(*args: Any, **kwargs: Any) -> dict[str, str]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(callbacks, "forward_headers", broken)
    recorder = _ContextRecorder()
    logger = logging.getLogger("gateway")
    logger.addHandler(recorder)
    try:
        with httpx.Client(base_url=gw.url) as client:
            answers = [client.post("/v1/chat/completions", content=chat()) for _ in range(2)]
    finally:
        logger.removeHandler(recorder)
    assert [a.status_code for a in answers] == [500, 500]
    errors_logged = [rid for message, rid in recorder.seen if message.startswith("unhandled error")]
    assert errors_logged == [a.headers["x-request-id"] for a in answers]
    assert paths["relay"] == 2
    assert request_id_var.get() == "-"


def test_a_client_leaving_while_its_relay_waits_for_a_connection_sends_nothing(
    gw: LiveServer, upstream: ScriptedUpstream, gateway_config: Any
) -> None:
    """An admission that had to wait (the key snapshot reloads) hands over to the step that waits
    for an upstream connection; a client that leaves then cancels that step, so its request never
    goes out (the admission's end used to drop the relay's hold on the step that followed it)."""
    from gateway.auth import apikeys

    gateway_config(llm_api_base=upstream.url, upstream__pool_size=1)
    gate = Gate()
    upstream.script("/v1/chat/completions", sse(chat_chunks(["a", "b"]), gate=gate, gate_after=1))
    upstream.script("/v1/chat/completions", json_answer(chat_completion("too late")))
    url = f"{gw.url}/v1/chat/completions"
    with httpx.Client(timeout=30) as client, client.stream("POST", url, content=chat(stream=True)) as held:
        chunks = held.iter_raw()
        assert next(chunks).startswith(b"data: ")  # it holds the pool's only connection
        apikeys.reset()  # the next request's authentication waits for a reload
        host, port = gw.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            body = chat()
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%b" % (len(body), body)
            )
            # Admitted (after the reload) and waiting for the pool's only connection.
            deadline = time.monotonic() + 10
            while not any(pool.waiters for pool in _upstream_pools()):
                assert time.monotonic() < deadline, "the request never waited for a connection"
                time.sleep(0.02)
        # The client has left: its wait for a connection is cancelled.
        _wait_for_pools(upstream.url, _nobody_waits, "the left client's wait never ended")
        gate.open()
        assert b"".join(chunks).endswith(DONE)
    # The one connection goes back idle: a request still queued for it would have been handed it.
    _wait_for_pools(
        upstream.url, lambda pool: bool(pool.idle) and _nobody_waits(pool), "the connection never came back"
    )
    assert len([r for r in upstream.requests if r.path == "/v1/chat/completions"]) == 1
