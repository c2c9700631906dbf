"""Envelopes, body ceiling, request id, CORS, health, metrics and admin against a live server."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from tests.servers import LiveServer, access_records


def raw_http(port: int, request: bytes, read_timeout: float = 5.0) -> bytes:
    """Send raw bytes and read until the server closes or the status line and body arrive."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_timeout) as s:
        s.sendall(request)
        data = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
                if b"\r\n\r\n" in data:
                    head, _, body = data.partition(b"\r\n\r\n")
                    length = [
                        line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
                    ]
                    if length and len(body) >= int(length[0].split(b":")[1]):
                        break
        except (TimeoutError, ConnectionResetError):
            pass
    return data


def test_health(live_gateway: LiveServer) -> None:
    r = httpx.get(f"{live_gateway.url}/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


def test_head_root(live_gateway: LiveServer) -> None:
    r = httpx.head(f"{live_gateway.url}/")
    assert r.status_code == 200


def test_unknown_v1_route_envelope(live_gateway: LiveServer) -> None:
    r = httpx.get(f"{live_gateway.url}/v1/nope")
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {
        "error": {
            "message": "Invalid URL (GET /v1/nope)",
            "type": "invalid_request_error",
            "param": None,
            "code": "unknown_route",
        }
    }


def test_unknown_non_api_route_is_json_not_html(live_gateway: LiveServer) -> None:
    r = httpx.get(f"{live_gateway.url}/nowhere")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "unknown_route"


def test_unknown_messages_route_uses_anthropic_envelope(live_gateway: LiveServer) -> None:
    r = httpx.post(f"{live_gateway.url}/v1/messages/nope", content=b"{}")
    assert r.status_code == 404
    body = r.json()
    assert body["type"] == "error"
    assert body["error"] == {"type": "not_found_error", "message": "Invalid URL (POST /v1/messages/nope)"}
    assert body["request_id"].startswith("req_")
    assert r.headers["request-id"] == body["request_id"]


def test_request_id_generated_and_echoed(live_gateway: LiveServer) -> None:
    r = httpx.get(f"{live_gateway.url}/health")
    assert r.headers["x-request-id"].startswith("req_")
    r = httpx.get(f"{live_gateway.url}/health", headers={"x-request-id": "client-abc.123"})
    assert r.headers["x-request-id"] == "client-abc.123"
    # An invalid incoming id (spaces, too long) is replaced, never echoed.
    r = httpx.get(f"{live_gateway.url}/health", headers={"x-request-id": "x" * 300})
    assert r.headers["x-request-id"].startswith("req_")


def test_declared_body_over_limit_is_413_before_reading(live_gateway: LiveServer, gateway_config) -> None:  # type: ignore[no-untyped-def]
    gateway_config(server__max_request_body_size_bytes=1000)
    # Declare 5000 bytes but send none: the answer must come without the body being read.
    response = raw_http(
        live_gateway.port,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 5000\r\n\r\n",
    )
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert orjson.loads(body) == {
        "error": {
            "message": "Request body exceeds the maximum size of 1000 bytes.",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_too_large",
        }
    }


def test_chunked_body_cut_off_at_limit(live_gateway: LiveServer, gateway_config) -> None:  # type: ignore[no-untyped-def]
    gateway_config(server__max_request_body_size_bytes=1000)

    def chunks() -> Iterator[bytes]:
        for _ in range(10):
            yield b"x" * 300

    r = httpx.post(f"{live_gateway.url}/v1/chat/completions", content=chunks())
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"


def test_chunked_body_under_limit_passes(live_gateway: LiveServer, gateway_config) -> None:  # type: ignore[no-untyped-def]
    gateway_config(server__max_request_body_size_bytes=1000)

    def chunks() -> Iterator[bytes]:
        yield b"x" * 300
        yield b"y" * 300

    r = httpx.post(f"{live_gateway.url}/v1/nope", content=chunks())
    assert r.status_code == 404  # reached routing: not refused by the ceiling


def test_413_on_messages_route_uses_anthropic_envelope(live_gateway: LiveServer, gateway_config) -> None:  # type: ignore[no-untyped-def]
    gateway_config(server__max_request_body_size_bytes=10)
    r = httpx.post(f"{live_gateway.url}/v1/messages", content=b"x" * 100)
    assert r.status_code == 413
    body = r.json()
    assert body["error"]["type"] == "request_too_large"
    assert r.headers["request-id"] == body["request_id"]


def test_cors_preflight(live_gateway: LiveServer, settings) -> None:  # type: ignore[no-untyped-def]
    settings.CORS_ALLOWED_ORIGINS = ["https://app.example"]
    r = httpx.options(
        f"{live_gateway.url}/v1/chat/completions",
        headers={
            "Origin": "https://app.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    assert "authorization" in r.headers["access-control-allow-headers"]
    # An origin not in the list gets no CORS grant.
    r = httpx.options(
        f"{live_gateway.url}/v1/chat/completions",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in r.headers


def test_metrics_count_a_request(live_gateway: LiveServer) -> None:
    def count() -> float:
        text = httpx.get(f"{live_gateway.url}/metrics").text
        for line in text.splitlines():
            if (
                line.startswith("gateway_http_requests_total{")
                and 'route="/health"' in line
                and 'status="200"' in line
            ):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before = count()
    httpx.get(f"{live_gateway.url}/health")
    httpx.get(f"{live_gateway.url}/health")
    assert count() == before + 2
    text = httpx.get(f"{live_gateway.url}/metrics").text
    assert "gateway_http_request_duration_seconds_bucket" in text
    assert "gateway_http_requests_in_flight" in text
    assert "gateway_websocket_connections_open" in text


def test_observe_request_counts_as_inc_and_observe_do() -> None:
    """``observe_request`` counts the request and records its duration in the gateway's metrics,
    with its labels: the samples a histogram with the same buckets records."""
    from prometheus_client import CollectorRegistry, Histogram

    from gateway.core.metrics import LATENCY_BUCKETS, REGISTRY, observe_request

    durations = [0.0004, 0.001, 0.0011, 0.07, 0.25, 299.0, 301.0]
    reference = Histogram("ref", "", buckets=LATENCY_BUCKETS, registry=CollectorRegistry())
    for seconds in durations:
        observe_request("/test/observe", "PUT", 207, seconds)
        reference.observe(seconds)

    def samples(metric_source: Any, name: str, **labels: str) -> dict[str, float]:
        found = {}
        for metric in metric_source.collect():
            for sample in metric.samples:
                if sample.name.endswith("_created") or not sample.name.startswith(name):
                    continue
                if all(sample.labels.get(k) == v for k, v in labels.items()):
                    found[sample.name.removeprefix(name) + sample.labels.get("le", "")] = sample.value
        return found

    ours = samples(REGISTRY, "gateway_http_request_duration_seconds", route="/test/observe", method="PUT")
    assert ours == samples(reference, "ref")
    assert ours["_bucket0.001"] == 2 and ours["_count"] == len(durations)
    counted = samples(REGISTRY, "gateway_http_requests", route="/test/observe", status="207")
    assert counted == {"_total": len(durations)}


def test_admin_login_page(live_gateway: LiveServer) -> None:
    r = httpx.get(f"{live_gateway.url}/admin/login/")
    assert r.status_code == 200
    assert "csrfmiddlewaretoken" in r.text
    # Static files for the admin are served too (no DEBUG needed).
    r = httpx.get(f"{live_gateway.url}/static/admin/css/base.css")
    assert r.status_code == 200


def test_the_site_middleware_runs_for_the_admin_only(live_gateway: LiveServer) -> None:
    """Sessions, CSRF and the clickjacking header (``gateway.site_middleware.SiteOnly``) guard the admin;
    the bearer-authenticated API answers without them."""
    site = httpx.get(f"{live_gateway.url}/admin/login/")
    assert site.headers["x-frame-options"] == "DENY" and "csrftoken" in site.cookies
    refused = httpx.post(f"{live_gateway.url}/admin/login/", data={"username": "a", "password": "b"})
    assert refused.status_code == 403 and "CSRF" in refused.text
    api = httpx.get(f"{live_gateway.url}/v1/conversations/conv_missing")
    assert api.status_code == 404 and api.json()["error"]["type"] == "invalid_request_error"
    assert "x-frame-options" not in api.headers and "set-cookie" not in api.headers
    # No CSRF check on the API: a cookie-less POST is judged by the route alone.
    created = httpx.post(f"{live_gateway.url}/v1/conversations", json={})
    assert created.status_code == 200 and created.json()["object"] == "conversation"


@pytest.mark.parametrize(
    ("raw_path", "path"),
    [
        ("/static/..%2f..%2fetc%2fpasswd", "/static/../../etc/passwd"),
        ("/static/admin/..%2f..%2f..%2fsettings.py", "/static/admin/../../../settings.py"),
        ("/static/..", "/static/.."),
        ("/static/a%00b", "/static/a\x00b"),
    ],
)
def test_static_traversal_is_a_404_without_a_traceback(
    live_gateway: LiveServer, caplog: pytest.LogCaptureFixture, raw_path: str, path: str
) -> None:
    answer = raw_http(live_gateway.port, f"GET {raw_path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404 Not Found\r\n")
    assert orjson.loads(body) == {
        "error": {
            "message": f"Invalid URL (GET {path})",
            "type": "invalid_request_error",
            "param": None,
            "code": "unknown_route",
        }
    }
    access = [r.getMessage() for r in access_records(caplog, 1)]
    assert len(access) == 1 and " 404 " in access[0]
    assert [r for r in caplog.records if r.levelno >= 40] == []


def test_a_missing_static_file_is_a_404(live_gateway: LiveServer) -> None:
    r = httpx.get(f"{live_gateway.url}/static/admin/css/nope.css")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "unknown_route"


@pytest.mark.django_db
def test_admin_superuser_can_log_in(client, django_user_model) -> None:  # type: ignore[no-untyped-def]
    django_user_model.objects.create_superuser("root", "root@example.com", "pw-123456")
    assert client.login(username="root", password="pw-123456")
    assert client.get("/admin/").status_code == 200


def test_an_error_below_django_is_a_500_envelope_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """What raises out of the ASGI app before answering (the static handler did, on a traversal)
    is answered in the envelope and logged once with its traceback, not uvicorn's plain text."""
    from gateway.core.middleware import GatewayASGIMiddleware

    async def broken(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise ValueError("a bug")

    server = LiveServer(GatewayASGIMiddleware(broken)).start()
    try:
        r = httpx.get(f"{server.url}/somewhere")
    finally:
        server.stop()
    assert r.status_code == 500
    assert r.json() == {
        "error": {
            "message": "The server had an error while processing your request.",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
        }
    }
    errors = [rec for rec in caplog.records if rec.levelno >= 40]
    assert [(rec.name, rec.getMessage()) for rec in errors] == [("gateway", "unhandled error on /somewhere")]
    assert errors[0].exc_info is not None and isinstance(errors[0].exc_info[1], ValueError)
    access = [rec.getMessage() for rec in caplog.records if rec.name == "gateway.access"]
    assert len(access) == 1 and "GET /somewhere 500" in access[0]
