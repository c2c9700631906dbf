"""The server's limits on what a client can hold: the request head, its header fields, and time.

Against ``manage.py serve`` itself, with the below-ASGI relay on and off (``[server] direct_relay``):
an oversized head is a 431 (a request line, 414), a request that does not arrive in full within
``request_read_timeout_s`` a 408, bytes that are not HTTP a 400, each in the envelope. The body
timeout is answered by whoever reads the body, so it is also checked on each of the three paths
in-process (the callback relay, its task, the ASGI app).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.conftest import serve_gateway
from tests.servers import GatewayProcess, LiveServer

READ_TIMEOUT_S = 1.0
HEAD_LIMIT = 64 * 1024


@pytest.fixture(scope="module", params=["relay", "no-relay"])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``manage.py serve`` with a short read timeout; ``.log`` is its output, written as it goes."""
    log = tmp_path_factory.mktemp("serve") / "gateway.log"
    env = {
        # Never reached: every request here is refused before it could go upstream.
        "LLM_API_BASE": "http://127.0.0.1:9",
        "GATEWAY_SERVER_REQUEST_READ_TIMEOUT_S": str(READ_TIMEOUT_S),
        "GATEWAY_SERVER_DIRECT_RELAY": "true" if request.param == "relay" else "false",
    }
    gateway = GatewayProcess(env, log=log).wait()
    gateway.log_path = log  # type: ignore[attr-defined]
    yield gateway
    gateway.stop()


def exchange(port: int, data: bytes, *, timeout: float = 10.0) -> tuple[bytes, float]:
    """Send ``data``, read until the server closes; the bytes and how long the server took."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(timeout)
        started = time.monotonic()
        sock.sendall(data)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass  # closed with our unread bytes in its buffer: the answer arrived first
        return received, time.monotonic() - started


def parse(answer: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    assert len(body) == int(headers["content-length"])
    return int(lines[0].split()[1]), headers, orjson.loads(body)


def envelope(message: str, code: str, type_: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def assert_refused(answer: bytes, status: int, body: dict[str, Any]) -> None:
    got_status, headers, got_body = parse(answer)
    assert (got_status, got_body) == (status, body)
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert headers["x-request-id"].startswith("req_")


def logged(served: Any, text: str) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if text in Path(served.log_path).read_text():
            return True
        time.sleep(0.05)
    return False


HEAD_TOO_LARGE = envelope(
    f"The request headers exceed the maximum size of {HEAD_LIMIT} bytes.", "request_header_fields_too_large"
)
TIMED_OUT = envelope(f"The request was not received within {READ_TIMEOUT_S:g}s.", "request_timeout")


# -- the head -----------------------------------------------------------------------------------


@pytest.mark.process
@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (HEAD_LIMIT + 1) + b"\r\n\r\n",
        # The head and its body in one write: the body does not count, the head alone is over.
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 2\r\nX-Big: " + b"a" * HEAD_LIMIT + b"\r\n\r\n{}",
    ],
    ids=["get", "post-with-body"],
)
def test_a_head_over_the_limit_is_a_431(served: Any, request_bytes: bytes) -> None:
    answer, _ = exchange(served.port, request_bytes)
    assert_refused(answer, 431, HEAD_TOO_LARGE)


@pytest.mark.process
def test_a_head_just_under_the_limit_is_served(served: Any) -> None:
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: "
    answer, _ = exchange(served.port, head + b"a" * (HEAD_LIMIT - len(head) - 100) + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")


@pytest.mark.process
def test_a_64_mib_header_is_cut_off_and_holds_no_memory(served: Any) -> None:
    rss_before = _rss(served.proc.pid)
    piece = b"a" * 65536
    sent = 0
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.settimeout(10)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        try:
            while sent < 64 * 1024 * 1024:
                sock.sendall(piece)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    # The server stopped reading within a read or so of the limit (the kernel buffers some more).
    assert sent < 16 * 1024 * 1024
    if answer:  # a reset can overtake the answer when our unread bytes are discarded
        assert_refused(answer, 431, HEAD_TOO_LARGE)
    assert _rss(served.proc.pid) - rss_before < 16 * 1024 * 1024


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.process
def test_header_fields_up_to_the_limit_are_served_and_one_more_is_a_431(served: Any) -> None:
    """``[server] max_request_headers`` (100) at its boundary: 100 fields, Host included, are
    served; 101 are refused."""

    def head(count: int) -> bytes:  # ``count`` header fields in all, Host and Connection included
        fields = b"".join(b"X-Field-%d: 1\r\n" % i for i in range(count - 2))
        return b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + fields + b"\r\n"

    answer, _ = exchange(served.port, head(100))
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer[:200]
    answer, _ = exchange(served.port, head(101))
    assert_refused(
        answer,
        431,
        envelope("The request has more than 100 header fields.", "request_header_fields_too_large"),
    )
    assert logged(served, "GET /health 431")


@pytest.mark.process
def test_a_request_line_over_the_limit_is_a_414(served: Any) -> None:
    answer, _ = exchange(served.port, b"GET /" + b"a" * (1024 * 1024) + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_refused(
        answer,
        414,
        envelope(f"The request line exceeds the maximum size of {HEAD_LIMIT} bytes.", "uri_too_long"),
    )


@pytest.mark.process
@pytest.mark.parametrize(
    "request_bytes",
    [
        b"FOO / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost x\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00",
    ],
    ids=["unknown-method", "broken-header", "tls-hello"],
)
def test_bytes_that_are_not_http_get_a_400_envelope(served: Any, request_bytes: bytes) -> None:
    answer, _ = exchange(served.port, request_bytes)
    assert_refused(answer, 400, envelope("Invalid HTTP request received.", "invalid_http_request"))


# -- time ---------------------------------------------------------------------------------------

LATE = {
    "head": b"GET /health HTTP/1.1\r\nHost: x\r\n",
    # The relay's route (callbacks, or the ASGI fast path without the relay).
    "short-body": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n{",
    "chunked-without-last-chunk": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
    b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n",
    # Django's handler reads this body.
    "short-body-django": b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n{",
}


@pytest.mark.process
@pytest.mark.parametrize("kind", list(LATE))
def test_a_request_that_does_not_arrive_in_time_is_a_408(served: Any, kind: str) -> None:
    answer, seconds = exchange(served.port, LATE[kind])
    assert_refused(answer, 408, TIMED_OUT)
    assert READ_TIMEOUT_S * 0.9 < seconds < READ_TIMEOUT_S + 5
    if kind != "head":
        path = "/v1/responses" if kind == "short-body-django" else "/v1/chat/completions"
        assert logged(served, f"POST {path} 408")


@pytest.mark.process
def test_a_late_anthropic_body_gets_the_anthropic_envelope(served: Any) -> None:
    answer, _ = exchange(
        served.port,
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n{",
    )
    status, headers, body = parse(answer)
    assert status == 408
    assert body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "The request was not received within 1s."},
        "request_id": headers["request-id"],
    }


@pytest.mark.process
def test_a_connection_that_sends_nothing_is_closed(served: Any) -> None:
    answer, seconds = exchange(served.port, b"")
    assert answer == b""
    assert READ_TIMEOUT_S * 0.9 < seconds < READ_TIMEOUT_S + 5


@pytest.mark.process
def test_the_timeout_is_per_request_not_per_connection(served: Any) -> None:
    """A keep-alive connection that answers requests for longer than the timeout is not cut."""
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.settimeout(10)
        for _ in range(3):
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while not answer.endswith(b"0\r\n\r\n"):
                answer += sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
            time.sleep(READ_TIMEOUT_S * 0.7)


# -- the body timeout on each path, in-process --------------------------------------------------


@pytest.fixture(params=["relay-on", "relay-off"])
def each_path(
    request: pytest.FixtureRequest, transactional_db: None, gateway_config: Any, upstream: Any
) -> Iterator[LiveServer]:
    gateway_config(llm_api_base=upstream.url, server__request_read_timeout_s=0.5)
    yield from serve_gateway(request.param)


def test_a_late_body_is_answered_408_on_each_path(each_path: LiveServer, upstream: Any) -> None:
    answer, seconds = exchange(each_path.port, LATE["short-body"])
    assert_refused(answer, 408, envelope("The request was not received within 0.5s.", "request_timeout"))
    assert 0.4 < seconds < 5
    assert upstream.requests == []


def test_a_pipelined_request_waits_for_its_turn_without_timing_out(
    transactional_db: None, gateway_config: Any, upstream: Any
) -> None:
    """Reading stops while the answer before it streams: that time is not the client's."""
    from tests.upstream import Gate, chat_chunks, chat_completion, json_answer, sse

    gateway_config(llm_api_base=upstream.url, server__request_read_timeout_s=READ_TIMEOUT_S)
    gate = Gate()
    upstream.script("/v1/chat/completions", sse(chat_chunks(["a", "b"]), gate=gate))
    upstream.script("/v1/chat/completions", json_answer(chat_completion("second")))
    stream = orjson.dumps({"model": "m", "messages": [], "stream": True})
    second = orjson.dumps({"model": "m", "messages": []})
    for server in serve_gateway("relay-on"):
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.settimeout(10)
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s"
                % (len(stream), stream)
                + b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(second)
            )
            time.sleep(READ_TIMEOUT_S * 2.5)  # the stream is held; the second body cannot be read
            gate.open()
            sock.sendall(second)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    first, _, rest = answer.partition(b"\r\n0\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200 OK\r\n") and b"[DONE]" in first
    status, _, body = parse(rest)
    assert status == 200 and body["choices"][0]["message"]["content"] == "second"
