"""``docker/nginx.conf``, the ingress example, in front of ``manage.py serve``: it answers, streams,
passes the WebSocket upgrade on and holds the limits the server has none for (a head's read time,
a head's size while it arrives). `make test` installs nginx (tests/ensure_tools.sh); without it these fail."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import ROOT, GatewayProcess, exchange, free_port, wait_port

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
HEADER_TIMEOUT_S = 1  # the example's client_header_timeout, shortened for the test

pytestmark = pytest.mark.process


def _config(workdir: Path, gateway_port: int, port: int) -> Path:
    """The example as shipped, with its addresses, files and header timeout set for this test."""
    text = (ROOT / "docker" / "nginx.conf").read_text()
    replacements = {
        "server gateway:8000;": f"server 127.0.0.1:{gateway_port};",
        "listen 8080;": f"listen 127.0.0.1:{port};",
        "client_header_timeout 60s;": f"client_header_timeout {HEADER_TIMEOUT_S}s;",
        "worker_processes auto;": f"worker_processes 1;\npid {workdir}/nginx.pid;\nerror_log {workdir}/error.log;",
        "http {": f"http {{\n    access_log off;\n    client_body_temp_path {workdir}/body;\n"
        f"    proxy_temp_path {workdir}/proxy;",
    }
    for old, new in replacements.items():
        assert old in text, old  # the example changed: keep this test in step with it
        text = text.replace(old, new, 1)
    path = workdir / "nginx.conf"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def ingress(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    assert NGINX is not None, "nginx is not installed: `make test` installs it (tests/ensure_tools.sh)"
    gateway = GatewayProcess({"LLM_API_BASE": "http://127.0.0.1:9"}).wait()
    workdir = tmp_path_factory.mktemp("nginx")
    port = free_port()
    conf = _config(workdir, gateway.port, port)
    proc = subprocess.Popen([NGINX, "-c", str(conf), "-p", str(workdir), "-g", "daemon off;"])
    try:
        wait_port(port)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        gateway.stop()


def test_a_request_goes_through_to_the_gateway(ingress: int) -> None:
    answer, _ = exchange(ingress, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"x-request-id: req_" in answer.lower()


def test_a_head_that_does_not_arrive_in_time_is_closed(ingress: int) -> None:
    answer, seconds = exchange(ingress, b"GET /health HTTP/1.1\r\nHost: x\r\n")
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408 ")  # nginx closes, or answers 408
    assert HEADER_TIMEOUT_S * 0.9 < seconds < HEADER_TIMEOUT_S + 5


def test_a_header_over_the_buffers_is_refused(ingress: int) -> None:
    """A 4 MiB header is refused by nginx once it passes a buffer (16 KiB), never gathered and
    forwarded (nginx reads and discards what follows before it closes)."""
    with socket.create_connection(("127.0.0.1", ingress)) as sock:
        sock.settimeout(10)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for _ in range(64):
                sock.sendall(b"a" * 65536)
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b"x-request-id" not in answer.lower()  # nginx's answer: the gateway never saw it


def test_a_websocket_upgrade_goes_through(ingress: int) -> None:
    """The handshake reaches the gateway (an open one here) and its 101 comes back through nginx."""
    key = base64.b64encode(os.urandom(16))
    head = (
        b"GET /v1/responses HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % key
    )
    with socket.create_connection(("127.0.0.1", ingress)) as sock:
        sock.settimeout(10)
        sock.sendall(head)
        answer: Any = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 101 "), answer[:200]
