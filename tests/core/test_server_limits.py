"""The server's limits on what a client can hold: the request head, its header fields, and time.

Against ``manage.py serve`` itself (stock uvicorn; the limits it has no setting for are held by
``gateway.core.middleware``): an oversized head is a 431 (a request line, 414) and a body that does not
arrive within ``request_read_timeout_s`` of its head a 408, each in the envelope; bytes that are not
HTTP get uvicorn's own 400 and a close. A head's read timeout (slowloris) and a head larger than
what uvicorn buffers are the ingress's to bound (``docs/operations.md``, ``docker/nginx.conf``).
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
from tests.servers import GatewayProcess, exchange

READ_TIMEOUT_S = 1.0
HEAD_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``manage.py serve`` with a short read timeout; ``.log`` is its output, written as it goes."""
    log = tmp_path_factory.mktemp("serve") / "gateway.log"
    env = {
        # Never reached: every request here is refused before it could go upstream.
        "LLM_API_BASE": "http://127.0.0.1:9",
        "GATEWAY_SERVER_REQUEST_READ_TIMEOUT_S": str(READ_TIMEOUT_S),
    }
    gateway = GatewayProcess(env, log=log).wait()
    gateway.log_path = log  # type: ignore[attr-defined]
    yield gateway
    gateway.stop()


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
    """A head over the limit, most of it the request line. (uvicorn itself refuses a URL over
    64 KiB with a 400: httptools' URL parser counts in 16 bits.)"""
    line = b"GET /" + b"a" * (60 * 1024) + b" HTTP/1.1\r\n"
    answer, _ = exchange(served.port, line + b"Host: x\r\nX-Pad: " + b"b" * (8 * 1024) + b"\r\n\r\n")
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
def test_bytes_that_are_not_http_get_a_400_and_a_close(served: Any, request_bytes: bytes) -> None:
    """uvicorn's own answer (plain text: no application sees these bytes), then the close."""
    answer, seconds = exchange(served.port, request_bytes)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer
    assert b"connection: close" in head.lower()
    assert body == b"Invalid HTTP request received."
    assert seconds < 5


# -- time ---------------------------------------------------------------------------------------

LATE = {
    # A pass-through route (the ASGI fast path reads the body).
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


# -- the body timeout in-process ------------------------------------------------------------------


def test_a_late_body_is_answered_408_in_process(
    transactional_db: None, gateway_config: Any, upstream: Any
) -> None:
    gateway_config(llm_api_base=upstream.url, server__request_read_timeout_s=0.5)
    for server in serve_gateway():
        answer, seconds = exchange(server.port, LATE["short-body"])
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
    for server in serve_gateway():
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
