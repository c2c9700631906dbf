"""HttpUpstream on the one outbound client (aiohttp) against real loopback servers.

Each test runs a small HTTP/1.1 server in the test's event loop (requests parsed by httptools), so it
can misbehave on purpose: close idle connections, stall mid-body, never answer, answer without a
length, cut an answer off.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httptools
import pytest

from gateway.core import config as config_module
from gateway.core import errors, outbound
from inference_app.upstream.http import HttpUpstream
from tests.servers import free_port


@dataclass
class Request:
    method: str = ""
    path: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    complete: bool = False

    def on_url(self, url: bytes) -> None:
        self.path += url.decode()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode().lower()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


# (connection number, request, writer) -> keep the connection open?
Handler = Callable[[int, Request, asyncio.StreamWriter], Awaitable[bool]]


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait for ``condition`` (a count or flag the other side moves), at most 5 s."""
    deadline = asyncio.get_running_loop().time() + 5
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.005)


class Server:
    """An HTTP/1.1 server on a loopback port that hands each parsed request to ``handler``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[Request] = []
        self.disconnected: list[asyncio.Event] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = self.connections
        self.connections += 1
        gone = asyncio.Event()
        self.disconnected.append(gone)
        read: asyncio.Task[bytes] | None = None
        try:
            while True:
                request = Request()
                parser = httptools.HttpRequestParser(request)
                while not request.complete:
                    if read is None:
                        read = asyncio.create_task(reader.read(65536))
                    data = await read
                    read = None
                    if not data:
                        return
                    parser.feed_data(data)
                request.method = parser.get_method().decode()
                self.requests.append(request)
                # Handle it while watching for the client going away (which cancels the handler).
                handling = asyncio.create_task(self.handler(number, request, writer))
                read = asyncio.create_task(reader.read(65536))
                await asyncio.wait({handling, read}, return_when=asyncio.FIRST_COMPLETED)
                if read.done() and (read.exception() is not None or not read.result()):
                    handling.cancel()
                    return
                if not await handling:
                    return
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            if read is not None:
                read.cancel()
            gone.set()
            writer.close()

    async def wait_disconnected(self, number: int, timeout: float = 2.0) -> None:
        await asyncio.wait_for(self.disconnected[number].wait(), timeout)


def answer(body: bytes = b"ok", status: str = "200 OK", extra: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body


async def echo(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
    writer.write(answer(f"{number}:{request.method} {request.path} {len(request.body)}".encode()))
    await writer.drain()
    return True


async def never(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
    await asyncio.sleep(30)
    return False


def upstream_at(url: str, **upstream: Any) -> HttpUpstream:
    changes = {f"upstream__{key}": value for key, value in upstream.items()}
    return HttpUpstream(config_module.replace(config_module.get_config(), llm_api_base=url, **changes))


async def fetch(upstream: HttpUpstream, path: str = "/v1/x", body: bytes | None = b"{}") -> tuple[int, bytes]:
    response = await upstream.send("POST", path, body=body, headers={"content-type": "application/json"})
    try:
        return response.status, await response.read()
    finally:
        await response.aclose()


async def test_sequential_requests_reuse_one_connection_and_send_only_our_headers() -> None:
    async with Server(echo) as server:
        upstream = upstream_at(server.url)
        for i in range(5):
            assert await fetch(upstream, f"/v1/x?i={i}") == (200, f"0:POST /v1/x?i={i} 2".encode())
        assert server.connections == 1
        # The client's headers, the host and the length: nothing of aiohttp's own (no Accept-Encoding,
        # so the upstream never compresses for a client that did not ask).
        assert server.requests[0].headers == {
            "host": server.url.removeprefix("http://"),
            "content-type": "application/json",
            "content-length": "2",
        }
        await upstream.aclose()


async def test_the_path_and_query_go_out_as_given() -> None:
    async with Server(echo) as server:
        upstream = upstream_at(server.url + "/prefix/v1")
        response = await upstream.send("GET", "/v1/models/a%2Fb", query="x=%41&y=a+b&z")
        assert await response.read() == b"0:GET /prefix/v1/models/a%2Fb?x=%41&y=a+b&z 0"
        await upstream.aclose()


async def test_response_headers_drop_hop_by_hop_and_the_body_stays_compressed() -> None:
    packed = gzip.compress(b'{"a":1}')

    async def handler(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        extra = (
            "Server: x\r\nDate: y\r\nKeep-Alive: timeout=5\r\nX-Request-Id: abc\r\n"
            "Content-Type: a/b\r\nContent-Encoding: gzip\r\nSet-Cookie: s=1\r\n"
        )
        writer.write(answer(packed, extra=extra))
        return True

    async with Server(handler) as server:
        upstream = upstream_at(server.url)
        for _ in range(2):
            response = await upstream.send("GET", "/v1/models")
            assert response.status == 200
            # Names lower-cased, values and order unchanged.
            assert response.headers == [
                ("content-length", str(len(packed))),
                ("x-request-id", "abc"),
                ("content-type", "a/b"),
                ("content-encoding", "gzip"),
                ("set-cookie", "s=1"),
            ]
            assert await response.read() == packed  # passed through as sent
        assert "cookie" not in server.requests[1].headers  # no cookie jar
        await upstream.aclose()


async def test_pool_limit_holds_the_rest_back_until_a_connection_is_free() -> None:
    release = asyncio.Event()
    in_flight = most = 0

    async def slow(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await release.wait()
        in_flight -= 1
        return await echo(number, request, writer)

    async with Server(slow) as server:
        upstream = upstream_at(server.url, pool_size=2)
        tasks = [asyncio.create_task(fetch(upstream, f"/v1/x?i={i}")) for i in range(6)]
        await until(lambda: len(server.requests) == 2, "two requests out")
        await asyncio.sleep(0.1)
        assert len(server.requests) == 2  # the other four wait for a connection
        release.set()
        results = await asyncio.gather(*tasks)
        assert all(status == 200 for status, _ in results)
        assert most == 2
        assert server.connections == 2
        await upstream.aclose()


async def test_waiting_for_a_connection_counts_against_the_read_timeout() -> None:
    async with Server(never) as server:
        upstream = upstream_at(server.url, pool_size=1, read_timeout_s=0.2)
        first = asyncio.create_task(fetch(upstream))
        with pytest.raises(errors.UpstreamTimeout, match=r"did not answer within 0\.2s"):
            await fetch(upstream)
        with pytest.raises(errors.UpstreamTimeout):
            await first
        await upstream.aclose()


async def test_idle_connection_closed_by_the_server_is_replaced() -> None:
    async def close_after_answer(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        await echo(number, request, writer)
        return False  # closes the connection once the answer is out

    async with Server(close_after_answer) as server:
        upstream = upstream_at(server.url, pool_size=1)
        assert await fetch(upstream) == (200, b"0:POST /v1/x 2")
        await server.wait_disconnected(0)
        assert await fetch(upstream) == (200, b"1:POST /v1/x 2")
        await upstream.aclose()


async def test_connection_idle_near_the_servers_keep_alive_limit_is_not_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(outbound, "IDLE_REUSE_S", 0.1)
    async with Server(echo) as server:
        upstream = upstream_at(server.url)
        assert await fetch(upstream) == (200, b"0:POST /v1/x 2")
        assert await fetch(upstream) == (200, b"0:POST /v1/x 2")
        await asyncio.sleep(0.3)
        assert await fetch(upstream) == (200, b"1:POST /v1/x 2")
        await server.wait_disconnected(0)
        await upstream.aclose()


async def test_request_on_a_connection_closed_as_it_was_reused_is_replayed_once() -> None:
    drop_next = False

    async def dropping(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        nonlocal drop_next
        if drop_next:
            drop_next = False
            return False  # closes without answering, as a server whose keep-alive timer just ran out
        return await echo(number, request, writer)

    async with Server(dropping) as server:
        upstream = upstream_at(server.url, pool_size=1)
        assert await fetch(upstream) == (200, b"0:POST /v1/x 2")
        drop_next = True
        assert await fetch(upstream, "/v1/y") == (200, b"1:POST /v1/y 2")
        assert [r.path for r in server.requests] == ["/v1/x", "/v1/y", "/v1/y"]

        # A streamed body cannot be replayed: the same failure is a 502.
        async def body() -> AsyncIterator[bytes]:
            yield b"{}"

        drop_next = True
        with pytest.raises(errors.UpstreamError, match="Could not reach"):
            await upstream.send("POST", "/v1/z", body=body())
        assert server.connections == 2
        await upstream.aclose()


async def test_connection_close_and_http_1_0_answers_are_not_reused() -> None:
    async def closing(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        if request.path == "/old":
            writer.write(b"HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\nx")
        else:
            writer.write(answer(b"x", extra="Connection: close\r\n"))
        await asyncio.sleep(1)  # keeps the socket open: the client must not reuse it anyway
        return False

    async with Server(closing) as server:
        upstream = upstream_at(server.url)
        for path in ("/v1/x", "/v1/x", "/old", "/old"):
            assert await fetch(upstream, path) == (200, b"x")
        assert server.connections == 4
        await upstream.aclose()


async def test_event_stream_is_handed_on_chunk_by_chunk_as_it_arrives() -> None:
    pieces = (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n")
    received: list[bytes] = []

    async def chunked(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for i, piece in enumerate(pieces):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            if request.path == "/v1/chat/completions":
                # The next piece is sent only once the client has handed this one on: nothing is
                # held back to be sent together.
                await until(lambda i=i: len(received) == i + 1, f"piece {i} handed on")
        writer.write(b"0\r\n\r\n")
        return True

    async with Server(chunked) as server:
        upstream = upstream_at(server.url)
        response = await upstream.send("POST", "/v1/chat/completions", body=b"{}")
        assert response.headers == [("content-type", "text/event-stream")]
        async for chunk in response:
            received.append(chunk)
        assert received == list(pieces)
        assert response.complete
        await response.aclose()
        # The terminating chunk ended it: pooled again, and still in step.
        assert await fetch(upstream) == (200, b"".join(pieces))
        assert server.connections == 1
        await upstream.aclose()


async def test_an_event_line_of_17_mib_passes_whole() -> None:
    line = b"data: " + b"x" * (17 * 1024 * 1024) + b"\n\n"

    async def big(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(line), line))
        await writer.drain()
        return True

    async with Server(big) as server:
        upstream = upstream_at(server.url)
        response = await upstream.send("POST", "/v1/chat/completions", body=b"{}")
        assert await response.read() == line
        await upstream.aclose()


async def test_response_without_length_is_read_to_eof() -> None:
    async def unframed(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nfirst ")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"second")
        return False

    async with Server(unframed) as server:
        upstream = upstream_at(server.url)
        assert await fetch(upstream) == (200, b"first second")
        assert await fetch(upstream) == (200, b"first second")
        assert server.connections == 2
        await upstream.aclose()


async def test_streamed_request_body_arrives_intact() -> None:
    pieces = [bytes([i]) * (256 * 1024 + i) for i in range(16)]  # ~4 MiB, odd sizes
    total = sum(map(len, pieces))

    async def body() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece
            await asyncio.sleep(0)

    async with Server(echo) as server:
        upstream = upstream_at(server.url)
        # No length given: sent chunked.
        response = await upstream.send("POST", "/v1/audio/transcriptions", body=body())
        assert await response.read() == f"0:POST /v1/audio/transcriptions {total}".encode()
        assert server.requests[0].headers["transfer-encoding"] == "chunked"
        assert bytes(server.requests[0].body) == b"".join(pieces)
        # A length given by the caller: sent raw, with that length.
        response = await upstream.send(
            "POST", "/v1/audio/transcriptions", body=body(), headers={"content-length": str(total)}
        )
        assert await response.read() == f"0:POST /v1/audio/transcriptions {total}".encode()
        assert server.requests[1].headers["content-length"] == str(total)
        assert "transfer-encoding" not in server.requests[1].headers
        assert bytes(server.requests[1].body) == b"".join(pieces)
        assert server.connections == 1
        await upstream.aclose()


async def test_stalled_body_times_out_and_closes_the_connection() -> None:
    async def stall(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(b"6\r\nsecond\r\n")
        await writer.drain()
        await asyncio.sleep(30)
        return False

    async with Server(stall) as server:
        upstream = upstream_at(server.url, stall_timeout_s=0.3)
        response = await upstream.send("GET", "/v1/x")
        chunks = aiter(response)
        assert await anext(chunks) == b"first"
        await asyncio.sleep(0.5)  # a slow reader is not a stalled upstream
        assert await anext(chunks) == b"second"
        started = asyncio.get_running_loop().time()
        with pytest.raises(
            errors.UpstreamTimeout, match=r"^The upstream stream stalled for more than 0\.3s\.$"
        ):
            await anext(chunks)
        assert 0.25 < asyncio.get_running_loop().time() - started < 1
        await server.wait_disconnected(0)
        await upstream.aclose()


async def test_headers_not_sent_in_time_is_a_timeout_and_closes_the_connection() -> None:
    async with Server(never) as server:
        upstream = upstream_at(server.url, read_timeout_s=0.2, stall_timeout_s=0.05)
        started = asyncio.get_running_loop().time()
        with pytest.raises(errors.UpstreamTimeout) as info:
            await fetch(upstream)
        # The read timeout, not the (shorter) stall timeout, bounds the wait for the headers.
        assert info.value.message == "The upstream model server did not answer within 0.2s."
        assert info.value.status == 504
        assert 0.15 < asyncio.get_running_loop().time() - started < 1
        await server.wait_disconnected(0)
        await upstream.aclose()


async def test_refused_connection_is_a_502() -> None:
    upstream = upstream_at(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(errors.UpstreamError) as info:
        await fetch(upstream)
    assert info.value.status == 502
    assert info.value.message == "Could not reach the upstream model server."
    await upstream.aclose()


async def test_connection_lost_mid_body_is_a_502() -> None:
    async def cut(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()
        return False

    async with Server(cut) as server:
        upstream = upstream_at(server.url)
        response = await upstream.send("GET", "/v1/x")
        chunks = aiter(response)
        assert await anext(chunks) == b"partial"
        with pytest.raises(errors.UpstreamError, match=r"^The upstream connection failed mid-response\.$"):
            await anext(chunks)
        await upstream.aclose()


async def test_cancelling_the_caller_closes_the_upstream_connection() -> None:
    async def hold(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        if request.path == "/v1/body":
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")
            await writer.drain()
        await asyncio.sleep(30)
        return False

    async with Server(hold) as server:
        upstream = upstream_at(server.url)
        # While waiting for the headers.
        task = asyncio.create_task(fetch(upstream, "/v1/headers"))
        await until(lambda: len(server.requests) == 1, "the request out")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await server.wait_disconnected(0)

        # While waiting for the body.
        first_chunk = asyncio.Event()

        async def read_body() -> None:
            response = await upstream.send("GET", "/v1/body")
            try:
                async for _ in response:
                    first_chunk.set()
            finally:
                await response.aclose()

        task = asyncio.create_task(read_body())
        await asyncio.wait_for(first_chunk.wait(), 5)  # the headers and a chunk came; the rest waits
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await server.wait_disconnected(1)
        await upstream.aclose()


async def test_partly_read_response_is_closed_not_pooled() -> None:
    async def big(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n" + b"x" * 1000)
        await writer.drain()
        await asyncio.sleep(30)
        return False

    async with Server(big) as server:
        upstream = upstream_at(server.url)
        response = await upstream.send("GET", "/v1/x")
        assert await anext(aiter(response)) == b"x" * 1000
        assert not response.complete
        await response.aclose()
        await server.wait_disconnected(0)
        await upstream.aclose()


async def test_one_session_per_event_loop_closed_by_close_upstreams() -> None:
    from inference_app.upstream.http import close_upstreams

    upstream = upstream_at("http://127.0.0.1:9")
    session = upstream.session()
    assert upstream.session() is session
    other: list[Any] = []
    await asyncio.to_thread(lambda: asyncio.run(_session_of(upstream, other)))
    assert other[0] is not session
    await close_upstreams()
    assert session.closed
    assert upstream.session() is not session  # a new one on next use
    await upstream.aclose()


async def _session_of(upstream: HttpUpstream, out: list[Any]) -> None:
    out.append(upstream.session())
    await upstream.aclose()


async def test_the_servers_shutdown_closes_its_loops_session(gateway_config: Any) -> None:
    from gateway.core.lifecycle import lifespan
    from inference_app.upstream.http import get_upstream

    gateway_config(llm_api_base="http://127.0.0.1:9")
    upstream = get_upstream()
    assert isinstance(upstream, HttpUpstream)
    session = upstream.session()
    messages = asyncio.Queue[dict[str, str]]()
    for kind in ("lifespan.startup", "lifespan.shutdown"):
        messages.put_nowait({"type": kind})
    sent: list[str] = []

    async def send(message: dict[str, str]) -> None:
        sent.append(message["type"])

    await lifespan({"type": "lifespan"}, messages.get, send)
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert session.closed
