"""The error module: each envelope, status and event shape."""

from __future__ import annotations

import orjson
import pytest
from django.test import AsyncClient

from gateway.core import errors


@pytest.mark.parametrize(
    "exc, status, type_",
    [
        (errors.BadRequest("m"), 400, "invalid_request_error"),
        (errors.AuthenticationFailed(), 401, "authentication_error"),
        (errors.PermissionDenied("m"), 403, "permission_error"),
        (errors.NotFound("m"), 404, "invalid_request_error"),
        (errors.Conflict("m"), 409, "invalid_request_error"),
        (errors.PayloadTooLarge("m"), 413, "invalid_request_error"),
        (errors.Unprocessable("m"), 422, "invalid_request_error"),
        (errors.RateLimited("m"), 429, "rate_limit_error"),
        (errors.ServerError("m"), 500, "server_error"),
        (errors.NotImplementedFeature("m"), 501, "invalid_request_error"),
        (errors.UpstreamError("m"), 502, "server_error"),
        (errors.ServiceUnavailable("m"), 503, "server_error"),
        (errors.UpstreamTimeout("m"), 504, "server_error"),
    ],
)
def test_openai_envelope(exc: errors.GatewayError, status: int, type_: str) -> None:
    got_status, body, headers = errors.render(exc, "/v1/responses", "req_1")
    assert got_status == status
    data = orjson.loads(body)
    assert set(data) == {"error"}
    assert data["error"]["type"] == type_
    assert set(data["error"]) == {"message", "type", "param", "code"}
    assert headers["Content-Type"] == "application/json"


@pytest.mark.parametrize(
    "exc, type_",
    [
        (errors.BadRequest("m"), "invalid_request_error"),
        (errors.AuthenticationFailed(), "authentication_error"),
        (errors.PermissionDenied("m"), "permission_error"),
        (errors.NotFound("m"), "not_found_error"),
        (errors.PayloadTooLarge("m"), "request_too_large"),
        (errors.RateLimited("m"), "rate_limit_error"),
        (errors.ServerError("m"), "api_error"),
        (errors.UpstreamError("m"), "api_error"),
        (errors.ServiceUnavailable("m"), "overloaded_error"),
    ],
)
def test_anthropic_envelope(exc: errors.GatewayError, type_: str) -> None:
    status, body, headers = errors.render(exc, "/v1/messages", "req_abc")
    assert status == exc.status
    assert orjson.loads(body) == {
        "type": "error",
        "error": {"type": type_, "message": "m" if exc.message == "m" else exc.message},
        "request_id": "req_abc",
    }
    assert headers["request-id"] == "req_abc"
    # A request id without the req_ prefix gets a fresh req_ id, the same in body and header.
    _, body, headers = errors.render(exc, "/v1/messages/count_tokens", "client-id")
    rid = orjson.loads(body)["request_id"]
    assert rid.startswith("req_") and headers["request-id"] == rid


def test_401_carries_www_authenticate() -> None:
    _, body, headers = errors.render(
        errors.AuthenticationFailed(code="missing_bearer_token"), "/v1/models", None
    )
    assert headers["WWW-Authenticate"] == "Bearer"
    assert orjson.loads(body) == {
        "error": {
            "message": "invalid bearer token",
            "type": "authentication_error",
            "param": None,
            "code": "missing_bearer_token",
        }
    }


def test_stream_error_events() -> None:
    exc = errors.UpstreamError("upstream went away", code="upstream_error")
    sse = errors.responses_sse_error(exc, 7)
    assert sse.startswith(b"event: error\ndata: ") and sse.endswith(b"\n\n")
    assert orjson.loads(sse.split(b"data: ", 1)[1]) == {
        "type": "error",
        "code": "upstream_error",
        "message": "upstream went away",
        "param": None,
        "sequence_number": 7,
    }
    ant = errors.anthropic_sse_error(exc)
    assert orjson.loads(ant.split(b"data: ", 1)[1]) == {
        "type": "error",
        "error": {"type": "api_error", "message": "upstream went away"},
    }
    ws = errors.ws_error_event(
        errors.BadRequest(
            "Previous response with id 'resp_missing' not found.",
            code="previous_response_not_found",
            param="previous_response_id",
        ),
        "turn-1",
    )
    assert ws == {
        "type": "error",
        "stream_id": "turn-1",
        "status": 400,
        "error": {
            "message": "Previous response with id 'resp_missing' not found.",
            "type": "invalid_request_error",
            "code": "previous_response_not_found",
            "param": "previous_response_id",
        },
    }


@pytest.mark.urls("tests.core.urls_testing")
async def test_malformed_json_wrong_type_wrong_method() -> None:
    client = AsyncClient()
    r = await client.post("/v1/test/echo", data=b"{not json", content_type="application/json")
    assert r.status_code == 400
    assert orjson.loads(r.content)["error"]["code"] == "invalid_json"
    r = await client.post("/v1/test/echo", data=b"a=b", content_type="application/x-www-form-urlencoded")
    assert r.status_code == 400
    assert orjson.loads(r.content)["error"]["code"] == "invalid_content_type"
    r = await client.post("/v1/test/echo", data=b"[1]", content_type="application/json")
    assert r.status_code == 400
    r = await client.get("/v1/test/echo")
    assert r.status_code == 405
    assert r["Allow"] == "POST"
    assert orjson.loads(r.content)["error"]["code"] == "method_not_allowed"
    r = await client.post("/v1/test/echo", data=b'{"a": 1}', content_type="application/json")
    assert r.status_code == 200 and orjson.loads(r.content) == {"echo": {"a": 1}}


@pytest.mark.urls("tests.core.urls_testing")
async def test_unhandled_exception_is_a_500_envelope_without_details() -> None:
    client = AsyncClient(raise_request_exception=False)
    r = await client.post("/v1/test/boom", data=b"{}", content_type="application/json")
    assert r.status_code == 500
    body = orjson.loads(r.content)
    assert body["error"]["type"] == "server_error"
    assert "secret internal detail" not in r.content.decode()


def test_debug_is_off_by_default(settings) -> None:  # type: ignore[no-untyped-def]
    assert settings.DEBUG is False
