"""The project's routes against a live server: health, unknown routes' envelopes, /metrics, admin and
static files, and an error below Django (the pipeline's rules: ``tests/core/test_pipeline.py``)."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from tests.servers import LiveServer, access_records, raw_http


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
