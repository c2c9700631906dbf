"""The upstream HTTP client (gateway/relay/http_client.py) against real loopback servers.

Each test runs a small HTTP/1.1 server in its own event loop (requests parsed by httptools), so it can
misbehave on purpose: close idle connections, stall mid-body, never answer, answer without a length.
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httptools
import httpx
import orjson
import pytest

from gateway import errors
from gateway.config import UpstreamConfig
from gateway.relay import http_client
from gateway.relay.http_client import HttpPool
from inference_app.upstream import _RESPONSE_SKIP
from tests.servers import LiveServer, free_port

ROOT = Path(__file__).resolve().parents[2]


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

    def __init__(self, handler: Handler, ssl_context: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.ssl_context = ssl_context
        self.connections = 0
        self.requests: list[Request] = []
        self.disconnected: list[asyncio.Event] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.ssl_context)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"{'https' if self.ssl_context else 'http'}://127.0.0.1:{port}"

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


def timeouts(**kwargs: float) -> UpstreamConfig:
    return UpstreamConfig(**kwargs)  # type: ignore[arg-type]


async def fetch(pool: HttpPool, path: str = "/v1/x", body: bytes | None = b"{}") -> tuple[int, bytes]:
    status, _, chunks = await pool.request("POST", path, {"content-type": "application/json"}, body)
    return status, b"".join([chunk async for chunk in chunks])


async def test_sequential_requests_reuse_one_connection() -> None:
    async with Server(echo) as server:
        pool = HttpPool(server.url, timeouts(), drop_headers=_RESPONSE_SKIP)
        for i in range(5):
            assert await fetch(pool, f"/v1/x?i={i}") == (200, f"0:POST /v1/x?i={i} 2".encode())
        assert server.connections == 1
        assert server.requests[0].headers["host"] == server.url.removeprefix("http://")
        assert server.requests[0].headers["content-length"] == "2"
        pool.close()


async def test_response_headers_drop_hop_by_hop_and_keep_the_rest_lower_cased() -> None:
    async def handler(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        extra = "Server: x\r\nDate: y\r\nKeep-Alive: timeout=5\r\nX-Request-Id: abc\r\nContent-Type: a/b\r\n"
        writer.write(answer(b"{}", extra=extra))
        return True

    async with Server(handler) as server:
        pool = HttpPool(server.url, timeouts(), drop_headers=_RESPONSE_SKIP)
        status, headers, chunks = await pool.request("GET", "/v1/models", {})
        assert status == 200
        # Names lower-cased (HTTP header names are case-insensitive), values and order unchanged.
        assert headers == [("content-length", "2"), ("x-request-id", "abc"), ("content-type", "a/b")]
        assert [chunk async for chunk in chunks] == [b"{}"]
        pool.close()


async def test_pool_limit_queues_callers_in_order() -> None:
    release = asyncio.Event()
    in_flight = 0
    most = 0

    async def slow(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await release.wait()
        in_flight -= 1
        return await echo(number, request, writer)

    async with Server(slow) as server:
        pool = HttpPool(server.url, timeouts(pool_size=2))
        tasks = [asyncio.create_task(fetch(pool, f"/v1/x?i={i}")) for i in range(6)]
        await until(lambda: len(server.requests) == 2, "two requests out")
        await until(lambda: sum(not w.done() for w in pool.waiters) == 4, "four waiting")
        assert len(server.requests) == 2  # the other four wait for a connection
        release.set()
        results = await asyncio.gather(*tasks)
        assert all(status == 200 for status, _ in results)
        assert most == 2
        assert server.connections == 2
        # First come, first served: the queued requests went out in the order they were made.
        assert [r.path for r in server.requests[2:]] == [f"/v1/x?i={i}" for i in range(2, 6)]
        assert pool.size == 2
        assert len(pool.idle) == 2
        pool.close()


async def test_waiting_for_a_connection_counts_against_the_read_timeout() -> None:
    async def never(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(30)
        return False

    async with Server(never) as server:
        pool = HttpPool(server.url, timeouts(pool_size=1, read_timeout_s=0.2))
        first = asyncio.create_task(fetch(pool))
        with pytest.raises(errors.UpstreamTimeout, match=r"did not answer within 0\.2s"):
            await fetch(pool)
        with pytest.raises(errors.UpstreamTimeout):
            await first
        assert pool.size == 0
        assert not pool.waiters or all(w.done() for w in pool.waiters)
        pool.close()


async def test_idle_connection_closed_by_the_server_is_replaced() -> None:
    async def close_after_answer(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        await echo(number, request, writer)
        return False  # closes the connection once the answer is out

    async with Server(close_after_answer) as server:
        pool = HttpPool(server.url, timeouts(pool_size=1))
        assert await fetch(pool) == (200, b"0:POST /v1/x 2")
        await server.wait_disconnected(0)
        await until(lambda: pool.idle == [], "the pool noticing the close")  # while the connection was idle
        assert pool.size == 0
        assert await fetch(pool) == (200, b"1:POST /v1/x 2")
        pool.close()


async def test_connection_idle_near_the_servers_keep_alive_limit_is_not_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http_client, "IDLE_REUSE_S", 0.1)
    async with Server(echo) as server:
        pool = HttpPool(server.url, timeouts())
        assert await fetch(pool) == (200, b"0:POST /v1/x 2")
        assert await fetch(pool) == (200, b"0:POST /v1/x 2")
        await asyncio.sleep(0.2)
        assert await fetch(pool) == (200, b"1:POST /v1/x 2")
        await server.wait_disconnected(0)
        assert pool.size == 1
        pool.close()


async def test_request_on_a_connection_closed_as_it_was_reused_is_replayed_once() -> None:
    drop_next = False

    async def dropping(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        nonlocal drop_next
        if drop_next:
            drop_next = False
            return False  # closes without answering, as a server whose keep-alive timer just ran out
        return await echo(number, request, writer)

    async with Server(dropping) as server:
        pool = HttpPool(server.url, timeouts(pool_size=1))
        assert await fetch(pool) == (200, b"0:POST /v1/x 2")
        drop_next = True
        assert await fetch(pool, "/v1/y") == (200, b"1:POST /v1/y 2")
        assert [r.path for r in server.requests] == ["/v1/x", "/v1/y", "/v1/y"]

        # A streamed body cannot be replayed: the same failure is a 502.
        async def body() -> AsyncIterator[bytes]:
            yield b"{}"

        drop_next = True
        with pytest.raises(errors.UpstreamError, match="Could not reach"):
            await pool.request("POST", "/v1/z", {}, body())
        assert server.connections == 2
        pool.close()


async def test_connection_close_answer_is_not_reused() -> None:
    async def close_header(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(answer(b"x", extra="Connection: close\r\n"))
        await asyncio.sleep(1)  # keeps the socket open: the client must not reuse it anyway
        return False

    async with Server(close_header) as server:
        pool = HttpPool(server.url, timeouts())
        assert await fetch(pool) == (200, b"x")
        assert await fetch(pool) == (200, b"x")
        assert server.connections == 2
        assert pool.idle == []
        pool.close()


async def test_http_1_0_answer_without_keep_alive_is_not_reused() -> None:
    async def old(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\nx")
        await asyncio.sleep(1)
        return False

    async with Server(old) as server:
        pool = HttpPool(server.url, timeouts())
        assert await fetch(pool) == (200, b"x")
        assert pool.idle == []
        pool.close()


async def test_chunked_response_is_decoded_and_handed_on_as_it_arrives() -> None:
    async def chunked(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for piece in (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.write(b"0\r\n\r\n")
        return True

    async with Server(chunked) as server:
        pool = HttpPool(server.url, timeouts(), drop_headers=_RESPONSE_SKIP)
        _, headers, chunks = await pool.request("POST", "/v1/chat/completions", {}, b"{}")
        assert headers == [("content-type", "text/event-stream")]
        assert [chunk async for chunk in chunks] == [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]
        assert len(pool.idle) == 1  # the terminating chunk ended the message: pooled again
        assert await fetch(pool) == (200, b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n")  # still in step
        assert server.connections == 1
        pool.close()


async def test_response_without_length_is_read_to_eof() -> None:
    async def unframed(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nfirst ")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"second")
        return False

    async with Server(unframed) as server:
        pool = HttpPool(server.url, timeouts())
        assert await fetch(pool) == (200, b"first second")
        assert pool.idle == []
        assert await fetch(pool) == (200, b"first second")
        assert server.connections == 2
        pool.close()


async def test_streamed_request_body_arrives_intact() -> None:
    pieces = [bytes([i]) * (256 * 1024 + i) for i in range(16)]  # ~4 MiB, odd sizes

    async def body() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece
            await asyncio.sleep(0)

    async with Server(echo) as server:
        pool = HttpPool(server.url, timeouts())
        # No length given: sent chunked.
        status, _, chunks = await pool.request("POST", "/v1/audio/transcriptions", {}, body())
        assert status == 200
        assert [c async for c in chunks] == [
            f"0:POST /v1/audio/transcriptions {sum(map(len, pieces))}".encode()
        ]
        assert server.requests[0].headers["transfer-encoding"] == "chunked"
        assert bytes(server.requests[0].body) == b"".join(pieces)
        # A length given by the caller: sent raw, with that length.
        total = str(sum(map(len, pieces)))
        status, _, chunks = await pool.request(
            "POST", "/v1/audio/transcriptions", {"content-length": total}, body()
        )
        assert [c async for c in chunks] == [f"0:POST /v1/audio/transcriptions {total}".encode()]
        assert server.requests[1].headers["content-length"] == total
        assert "transfer-encoding" not in server.requests[1].headers
        assert bytes(server.requests[1].body) == b"".join(pieces)
        assert server.connections == 1
        pool.close()


async def test_stalled_body_times_out_and_closes_the_connection() -> None:
    async def stall(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(b"6\r\nsecond\r\n")
        await writer.drain()
        await asyncio.sleep(30)
        return False

    async with Server(stall) as server:
        pool = HttpPool(server.url, timeouts(stall_timeout_s=0.3))
        _, _, chunks = await pool.request("GET", "/v1/x", {})
        assert await anext(chunks) == b"first"
        assert await anext(chunks) == b"second"
        with pytest.raises(
            errors.UpstreamTimeout, match=r"^The upstream stream stalled for more than 0\.3s\.$"
        ):
            await anext(chunks)
        await server.wait_disconnected(0)
        assert pool.size == 0
        pool.close()


async def test_headers_not_sent_in_time_is_a_timeout_and_closes_the_connection() -> None:
    async def never(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(30)
        return False

    async with Server(never) as server:
        pool = HttpPool(server.url, timeouts(read_timeout_s=0.2))
        started = asyncio.get_running_loop().time()
        with pytest.raises(errors.UpstreamTimeout) as info:
            await fetch(pool)
        assert info.value.message == "The upstream model server did not answer within 0.2s."
        assert info.value.status == 504
        assert asyncio.get_running_loop().time() - started < 1
        await server.wait_disconnected(0)
        pool.close()


async def test_refused_connection_is_a_502() -> None:
    pool = HttpPool(f"http://127.0.0.1:{free_port()}", timeouts())
    with pytest.raises(errors.UpstreamError) as info:
        await fetch(pool)
    assert info.value.status == 502
    assert info.value.message == "Could not reach the upstream model server."
    assert pool.size == 0
    pool.close()


async def test_connection_lost_mid_body_is_a_502() -> None:
    async def cut(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()
        return False

    async with Server(cut) as server:
        pool = HttpPool(server.url, timeouts())
        _, _, chunks = await pool.request("GET", "/v1/x", {})
        assert await anext(chunks) == b"partial"
        with pytest.raises(errors.UpstreamError, match=r"^The upstream connection failed mid-response\.$"):
            await anext(chunks)
        assert pool.size == 0
        pool.close()


async def test_cancelling_the_caller_closes_the_upstream_connection() -> None:
    async def hold(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        if request.path == "/v1/body":
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")
            await writer.drain()
        await asyncio.sleep(30)
        return False

    async with Server(hold) as server:
        pool = HttpPool(server.url, timeouts())
        # While waiting for the headers.
        task = asyncio.create_task(fetch(pool, "/v1/headers"))
        await until(lambda: len(server.requests) == 1, "the request out")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await server.wait_disconnected(0)

        # While waiting for the body.
        first_chunk = asyncio.Event()

        async def read_body() -> None:
            _, _, chunks = await pool.request("GET", "/v1/body", {})
            async for _ in chunks:
                first_chunk.set()

        task = asyncio.create_task(read_body())
        await asyncio.wait_for(first_chunk.wait(), 5)  # the headers and a chunk came; the rest waits
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await server.wait_disconnected(1)
        assert pool.size == 0
        assert pool.idle == []
        pool.close()


async def test_partly_read_response_is_closed_not_pooled() -> None:
    async def big(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n" + b"x" * 1000)
        await writer.drain()
        await asyncio.sleep(30)
        return False

    async with Server(big) as server:
        pool = HttpPool(server.url, timeouts())
        _, _, chunks = await pool.request("GET", "/v1/x", {})
        assert await anext(chunks) == b"x" * 1000
        await chunks.aclose()
        await server.wait_disconnected(0)
        assert pool.size == 0
        assert pool.idle == []
        pool.close()


async def test_slow_reader_pauses_the_socket() -> None:
    size = 8 * 1024 * 1024

    async def huge(number: int, request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):
            writer.write(b"y" * 65536)
            await writer.drain()
        return True

    async with Server(huge) as server:
        pool = HttpPool(server.url, timeouts())
        _, _, chunks = await pool.request("GET", "/v1/x", {})
        # The reader dawdles: the client stops reading at its high-water mark.
        await until(
            lambda: any(
                c.reading_paused
                for c in gc.get_objects()
                if type(c) is http_client.Connection and c.pool is pool  # type(): a proxy stays unread
            ),
            "the client pausing its reads",
        )
        first = await anext(chunks)
        assert len(first) < 2 * 1024 * 1024
        rest = b"".join([chunk async for chunk in chunks])
        assert len(first) + len(rest) == size
        assert len(pool.idle) == 1
        pool.close()


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


async def test_https_upstream(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(cert))
    async with Server(echo, ssl_context=server_ctx) as server:
        pool = HttpPool(server.url, timeouts(), ssl_context=client_ctx)
        for _ in range(3):
            assert await fetch(pool) == (200, b"0:POST /v1/x 2")
        assert server.connections == 1
        pool.close()
        # Without trusting the certificate, the handshake fails: the upstream is unreachable.
        untrusting = HttpPool(server.url, timeouts())
        with pytest.raises(errors.UpstreamError, match="Could not reach"):
            await fetch(untrusting)
        untrusting.close()


class _Recorder:
    def __init__(self, log: list[tuple[str, bytes]], name: str) -> None:
        self.log, self.name, self.closing = log, name, False

    def write(self, data: bytes) -> None:
        self.log.append((self.name, data))

    def writelines(self, parts: list[bytes]) -> None:
        self.log.append((self.name + " (lines)", b"".join(parts)))

    def is_closing(self) -> bool:
        return self.closing

    def abort(self) -> None:
        self.closing = True
        self.log.append((self.name + " (aborted)", b""))


async def test_outbox_writes_once_the_ready_callbacks_have_run() -> None:
    loop = asyncio.get_running_loop()
    outbox = http_client.Outbox(loop)
    log: list[tuple[str, bytes]] = []
    a, b, gone = _Recorder(log, "a"), _Recorder(log, "b"), _Recorder(log, "gone")

    def ready_callback() -> None:
        outbox.write(b, b"3")  # ready before the flush: written in the same pass, in order
        gone.closing = True

    loop.call_soon(ready_callback)
    outbox.write(a, b"1")
    outbox.write(gone, b"lost")
    outbox.write(a, b"2")
    assert log == []  # nothing is written while callbacks are running
    await asyncio.sleep(0)
    # One write a connection, of what was held for it in order; a transport closed meanwhile gets
    # nothing.
    assert log == [("a", b"12"), ("b", b"3")]
    outbox.write(a, b"4")
    outbox.flush()  # what a relay does before it closes the client's connection
    assert log[-1] == ("a", b"4")
    await asyncio.sleep(0)
    assert len(log) == 3  # the flush scheduled for it finds nothing left
    # Large pieces are not copied together: one writelines (uvloop: one writev).
    big = b"x" * (http_client._JOIN_LIMIT + 1)
    outbox.write(a, b"head")
    outbox.write(a, big)
    await asyncio.sleep(0)
    assert log[-1] == ("a (lines)", b"head" + big)


async def test_outbox_runs_what_follows_one_connections_writes_after_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()
    outbox = http_client.Outbox(loop)
    log: list[tuple[str, bytes]] = []
    a, b = _Recorder(log, "a"), _Recorder(log, "b")

    def note(name: str) -> None:
        log.append((name, b""))

    def broken() -> None:
        raise RuntimeError("a bug")

    outbox.then(note, "nothing held: at once")
    assert log == [("nothing held: at once", b"")]
    del log[:]
    # One connection's writes (one request in flight): its bytes first, the book-keeping after.
    outbox.write(a, b"1")
    outbox.then(note, "after 1")
    outbox.then(broken)
    outbox.write(a, b"2")
    outbox.then(note, "after 2")
    assert log == []
    await asyncio.sleep(0)
    assert log == [("a", b"12"), ("after 1", b""), ("after 2", b"")]
    assert "unhandled error after a write" in caplog.text  # logged; the rest still ran
    # Several connections' writes: the work first, then the writes that wake their readers.
    del log[:]
    outbox.write(a, b"3")
    outbox.then(note, "after 3")
    outbox.write(b, b"4")
    outbox.then(note, "after 4")
    await asyncio.sleep(0)
    assert log == [("after 3", b""), ("after 4", b""), ("a", b"3"), ("b", b"4")]
    # The next turn starts over: one connection again.
    del log[:]
    outbox.write(b, b"5")
    outbox.then(note, "after 5")
    outbox.flush()  # a relay closing its client's connection: all of it, at once
    assert log == [("b", b"5"), ("after 5", b"")]
    # A write that fails ends its own connection and loses nothing of the rest: the work that
    # follows it, the other connections' writes.
    del log[:]
    caplog.clear()
    broken_transport = _Recorder(log, "broken")
    broken_transport.write = lambda data: broken()  # type: ignore[method-assign]
    outbox.write(broken_transport, b"6")
    outbox.then(note, "after 6")
    outbox.flush()
    assert log == [("broken (aborted)", b""), ("after 6", b"")]
    assert "a held write failed; aborting its connection" in caplog.text
    del log[:]
    broken_transport.closing = False
    outbox.write(broken_transport, b"7")
    outbox.write(a, b"8")
    outbox.then(note, "after 7 and 8")
    outbox.flush()
    assert log == [("after 7 and 8", b""), ("broken (aborted)", b""), ("a", b"8")]


class _Clock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _poll(limit_us: float = 200, lone: list[bool] | None = None) -> tuple[http_client.IdlePoll, _Clock]:
    clock = _Clock()
    state = lone if lone is not None else [True]
    poll = http_client.IdlePoll(asyncio.get_running_loop(), limit_us / 1e6, lambda: state[0], clock)
    return poll, clock


def _waits(poll: http_client.IdlePoll, clock: _Clock, us: float, count: int) -> None:
    """``count`` writes, each ``us`` after the one before it."""
    for _ in range(count):
        clock.now += us / 1e6
        poll.wrote()


async def test_idle_poll_window_grows_to_cover_short_waits_and_no_further() -> None:
    poll, clock = _poll(limit_us=200)
    poll.wrote()
    assert poll.window == 0.0  # nothing measured yet: nothing polled
    _waits(poll, clock, 70, 1)
    assert poll.window == pytest.approx(50e-6)  # a short wait: a quarter of the limit to start
    _waits(poll, clock, 70, 1)
    assert poll.window == pytest.approx(100e-6)  # still missed: doubled
    _waits(poll, clock, 70, 20)
    assert poll.window == pytest.approx(100e-6)  # covered now: left alone
    _waits(poll, clock, 190, 3)
    assert poll.window == pytest.approx(200e-6)  # never past the limit


async def test_idle_poll_window_shrinks_to_nothing_for_long_waits() -> None:
    poll, clock = _poll(limit_us=200)
    poll.wrote()
    _waits(poll, clock, 150, 3)
    assert poll.window == pytest.approx(200e-6)
    # A slow upstream (a real model's first token): waits of milliseconds are not polled for.
    expected = [100e-6, 50e-6, 25e-6, 0.0, 0.0]
    for window in expected:
        _waits(poll, clock, 5000, 1)
        assert poll.window == pytest.approx(window)
    # Short waits again: it grows back.
    _waits(poll, clock, 40, 1)
    assert poll.window == pytest.approx(50e-6)


async def test_idle_poll_polls_only_after_a_streak_of_lone_writes() -> None:
    lone = [True]
    poll, clock = _poll(limit_us=200, lone=lone)
    poll.wrote()
    _waits(poll, clock, 150, 3)
    assert poll.window > 0
    # Fewer than STREAK lone writes so far: a window, but nothing polled.
    assert poll.streak < poll.STREAK and not poll.polling
    _waits(poll, clock, 150, poll.STREAK - poll.streak)
    assert poll.polling and poll.until == pytest.approx(clock.now + poll.window)
    # A write with several exchanges in flight: no poll scheduled, the streak starts over, and the
    # wait after it is not measured.
    poll.polling = False
    window = poll.window
    lone[0] = False
    _waits(poll, clock, 150, 1)
    assert poll.streak == 0 and poll.since == 0.0 and not poll.polling
    lone[0] = True
    _waits(poll, clock, 9000, 1)  # from the non-lone write: not measured, so no shrink
    assert poll.window == window
    _waits(poll, clock, 150, poll.STREAK - 2)
    assert not poll.polling  # one short of the streak
    _waits(poll, clock, 150, 1)
    assert poll.polling


async def test_idle_poll_keeps_the_loop_polling_until_its_deadline() -> None:
    """On a running loop: once polling, a step runs each loop iteration (``call_soon``: the loop
    polls its sockets without blocking) until the window ends, then it stops; other callbacks run
    meanwhile. The clock moves 0.1 ms a reading: 50 steps for a 5 ms window, however busy the
    machine."""
    loop = asyncio.get_running_loop()
    clock = _Clock()

    def step() -> float:
        clock.now += 0.0001
        return clock.now

    poll = http_client.IdlePoll(loop, 0.005, lambda: True, step)
    poll.window = 0.005
    poll.streak = poll.STREAK
    poll.wrote()
    assert poll.polling
    start = clock.now
    ran: list[int] = []
    loop.call_soon(ran.append, 1)
    for _ in range(1000):
        if not poll.polling:
            break
        await asyncio.sleep(0)  # one loop iteration
    assert not poll.polling
    assert ran == [1]
    assert round((clock.now - start) / 0.0001) in (50, 51)  # a step an iteration, to the deadline


@pytest.mark.django_db(transaction=True)
def test_the_http_upstream_runs_on_this_client_under_stock_uvicorn(gateway_config: Any) -> None:
    """What ``manage.py serve`` falls back to on a uvicorn mismatch (stock ``httptools`` protocol, no
    relay code loaded) still reaches an HTTP upstream through this client: only the uvicorn-internals
    part of ``gateway.relay`` is switched off."""
    from gateway.asgi import application
    from inference_app.upstream import HttpUpstream, close_upstreams, get_upstream
    from tests.upstream import ScriptedUpstream, chat_completion, json_answer

    scripted = ScriptedUpstream().start()
    server = LiveServer(application, on_stop=close_upstreams, http="httptools").start()
    try:
        gateway_config(llm_api_base=scripted.url)
        answer = orjson.dumps(chat_completion("via the lean client"))
        scripted.script("/v1/chat/completions", json_answer(answer))
        response = httpx.post(f"{server.url}/v1/chat/completions", content=b'{"model":"m"}', timeout=10)
        assert response.status_code == 200 and response.content == answer
        upstream = get_upstream()
        assert isinstance(upstream, HttpUpstream) and upstream.client is HttpPool
        pool = upstream.pool(server.loop)  # the one the request went out on
        assert isinstance(pool, HttpPool) and pool.loop is server.loop
    finally:
        server.stop()
        scripted.stop()


def test_without_the_client_handed_over_the_http_upstream_says_so(
    monkeypatch: pytest.MonkeyPatch, gateway_config: Any
) -> None:
    from inference_app import upstream

    monkeypatch.setattr(upstream, "_http_client", None)
    gateway_config(llm_api_base="http://127.0.0.1:9")
    with pytest.raises(RuntimeError, match=r"AppConfig\.ready"):
        upstream.get_upstream()


@pytest.mark.process
def test_a_celery_worker_process_gets_the_client() -> None:
    """A worker sets Django up when it imports its task modules (Celery's Django fix-up), which runs
    the gateway app's ``ready()``: an ``HttpUpstream`` built in a task has the lean client."""
    script = (
        "from gateway.celery import app\n"
        "app.loader.import_default_modules()\n"
        "from gateway.relay.http_client import HttpPool\n"
        "from inference_app.upstream import http_client\n"
        "assert http_client() is HttpPool\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
