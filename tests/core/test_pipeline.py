"""The one rule pipeline (``gateway.core.pipeline``): what ``Passage``, ``admit`` and ``finish`` do, in
the order every path applies them, and the same rules against a live server.

Each rule has one home:

=========================================================  ============================================
rule                                                       home
=========================================================  ============================================
request id and log context                                 here
body ceiling (declared length, counted body)               here; a streamed multipart upload:
                                                           ``tests/passthrough/test_audio.py``
CORS (preflight, headers on every answer and refusal)      here
authentication before the route's methods; 405 + Allow     here
who the caller is: API keys, open gateway                  ``tests/core/auth/test_apikeys.py``
OIDC bearer tokens                                         ``tests/core/auth/test_oidc.py``
WebSocket upgrade                                          ``tests/core/auth/test_websocket.py``
stored-state access (``OPENAI_API_KEY`` rule, owners)      ``tests/core/auth/test_stored_state.py``
server limits (head size, header count, read timeout)      ``tests/core/test_server_limits.py``
finish: 499                                                here
finish: metrics                                            ``tests/core/test_metrics.py``
finish: access log                                         ``tests/core/test_logging.py``
=========================================================  ============================================

Each app's routes are checked to apply a rule where they have code of their own for it: the Responses
fast path (``tests/responses/test_fastpath_cache.py``), stored state on every Responses and
Conversations route (``tests/responses/test_access_rules.py``, ``tests/conversations/test_ownership.py``)
and the Anthropic envelope of a refusal (``tests/messages/test_messages.py``).
"""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.core import errors, fastroutes
from gateway.core.logging import request_id_var
from gateway.core.metrics import HTTP_IN_FLIGHT, REGISTRY
from gateway.core.middleware import GatewayASGIMiddleware
from gateway.core.pipeline import Passage, admit, admitted, finish
from tests.servers import LiveServer, free_port, raw_http
from tests.upstream import ScriptedUpstream

ROOT = Path(__file__).resolve().parents[2]
POST = frozenset({"POST"})


@pytest.fixture
def gw(live_gateway: LiveServer, upstream: ScriptedUpstream, gateway_config: Any) -> LiveServer:
    """The live gateway relaying to the scripted upstream."""
    gateway_config(llm_api_base=upstream.url)
    return live_gateway


def _in_flight() -> float:
    return HTTP_IN_FLIGHT._value.get()  # type: ignore[attr-defined]  # a test may look inside


# --- the request id and the log context -------------------------------------------------------


def test_a_passage_sets_the_log_context_and_finish_resets_it() -> None:
    assert request_id_var.get() == "-"
    before = _in_flight()
    passage = Passage("POST", "/v1/chat/completions", "caller-id-1", "10")
    assert passage.request_id == "caller-id-1" and request_id_var.get() == "caller-id-1"
    assert _in_flight() == before + 1 and passage.refusal is None
    finish(passage, 200)
    assert request_id_var.get() == "-" and _in_flight() == before


def test_an_insane_request_id_is_replaced() -> None:
    passage = Passage("POST", "/v1/embeddings", "no spaces allowed", None)
    assert passage.request_id.startswith("req_")
    finish(passage, 200)


def test_a_websocket_connection_runs_in_its_log_context() -> None:
    seen: dict[str, str] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen["context"] = request_id_var.get()
        seen["scope"] = scope["gateway.request_id"]

    scope = {"type": "websocket", "path": "/v1/responses", "headers": [(b"x-request-id", b"ws-caller-1")]}
    asyncio.run(GatewayASGIMiddleware(app)(scope, None, None))
    assert seen == {"context": "ws-caller-1", "scope": "ws-caller-1"}
    assert request_id_var.get() == "-"


def test_request_id_generated_and_echoed(live_gateway: LiveServer) -> None:
    r = httpx.get(f"{live_gateway.url}/health")
    assert r.headers["x-request-id"].startswith("req_")
    r = httpx.get(f"{live_gateway.url}/health", headers={"x-request-id": "client-abc.123"})
    assert r.headers["x-request-id"] == "client-abc.123"
    # An invalid incoming id (spaces, too long) is replaced, never echoed.
    r = httpx.get(f"{live_gateway.url}/health", headers={"x-request-id": "x" * 300})
    assert r.headers["x-request-id"].startswith("req_")


def test_request_id_echoed_on_passthrough(gw: LiveServer) -> None:
    r = httpx.post(
        f"{gw.url}/v1/embeddings", json={"model": "m", "input": "x"}, headers={"x-request-id": "abc-1"}
    )
    assert r.headers["x-request-id"] == "abc-1"


# --- the body ceiling -------------------------------------------------------------------------


def test_the_body_ceiling_refuses_a_declared_length(gateway_config: Any) -> None:
    gateway_config(server__max_request_body_size_bytes=100)
    passage = Passage("POST", "/v1/chat/completions", None, "101")
    assert isinstance(passage.refusal, errors.GatewayError) and passage.refusal.status == 413
    finish(passage, 413)
    passage = Passage("POST", "/v1/chat/completions", None, "100")
    assert passage.refusal is None
    finish(passage, 200)


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


def test_vllm_routes_keep_the_body_ceiling(
    gw: LiveServer, upstream: ScriptedUpstream, gateway_config: Any
) -> None:
    gateway_config(server__max_request_body_size_bytes=1000)
    for path in ("/v1/score", "/pooling"):
        r = httpx.post(f"{gw.url}{path}", content=b'{"input":"' + b"x" * 2000 + b'"}')
        assert r.status_code == 413, path
        assert r.json()["error"]["code"] == "request_too_large"
    assert upstream.requests == []


# --- CORS -------------------------------------------------------------------------------------


def test_a_refusal_carries_the_cors_headers(gateway_config: Any, settings: Any) -> None:
    settings.CORS_ALLOWED_ORIGINS = ["https://app.example"]
    gateway_config(auth__require_api_key=True)
    passage = Passage("POST", "/v1/chat/completions", None, None)
    try:
        with pytest.raises(errors.AuthenticationFailed):
            admit(passage, {"origin": "https://app.example"}, POST)
        assert (b"access-control-allow-origin", b"https://app.example") in passage.cors
    finally:
        finish(passage, 401)


def preflight(base: str) -> httpx.Response:
    """A browser's CORS preflight for a POST with a bearer token and a JSON body."""
    return httpx.options(
        f"{base}/v1/chat/completions",
        headers={
            "Origin": "https://app.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )


def test_cors_preflight(live_gateway: LiveServer, settings) -> None:  # type: ignore[no-untyped-def]
    settings.CORS_ALLOWED_ORIGINS = ["https://app.example"]
    r = preflight(live_gateway.url)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    assert "authorization" in r.headers["access-control-allow-headers"]
    # An origin not in the list gets no CORS grant.
    r = httpx.options(
        f"{live_gateway.url}/v1/chat/completions",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in r.headers


def test_cors_on_passthrough_route(gw: LiveServer, upstream: ScriptedUpstream, settings: Any) -> None:
    settings.CORS_ALLOWED_ORIGINS = ["https://app.example"]
    r = httpx.post(
        f"{gw.url}/v1/chat/completions",
        json={"model": "m", "messages": []},
        headers={"Origin": "https://app.example"},
    )
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    assert r.headers["access-control-expose-headers"] == "x-request-id, request-id"
    assert r.headers["vary"] == "origin"
    other = httpx.post(
        f"{gw.url}/v1/chat/completions",
        json={"model": "m", "messages": []},
        headers={"Origin": "https://evil.example"},
    )
    assert "access-control-allow-origin" not in other.headers
    preflight = httpx.options(
        f"{gw.url}/v1/chat/completions",
        headers={
            "Origin": "https://app.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    # Preflights never reach the upstream; the two POSTs did.
    assert [rec.method for rec in upstream.requests] == ["POST", "POST"]


def test_cors_headers_on_gateway_errors(live_gateway: LiveServer, gateway_config: Any, settings: Any) -> None:
    settings.CORS_ALLOWED_ORIGINS = ["https://app.example"]
    gateway_config(llm_api_base=f"http://127.0.0.1:{free_port()}")
    r = httpx.post(
        f"{live_gateway.url}/v1/embeddings", content=b"{}", headers={"Origin": "https://app.example"}
    )
    assert r.status_code == 502
    assert r.headers["access-control-allow-origin"] == "https://app.example"


def test_cors_preflight_is_not_refused_and_refusals_carry_cors(
    live_gateway: Any, oidc: Any, settings: Any
) -> None:
    settings.CORS_ALLOWED_ORIGINS = ["https://app.example"]
    r = preflight(live_gateway.url)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    # The 401 itself is readable by the browser app.
    r = httpx.post(f"{live_gateway.url}/v1/chat/completions", headers={"Origin": "https://app.example"})
    assert r.status_code == 401
    assert r.headers["access-control-allow-origin"] == "https://app.example"


# --- authentication, then the route's methods -------------------------------------------------


def test_admit_checks_the_method_after_authentication(gateway_config: Any) -> None:
    passage = Passage("GET", "/v1/chat/completions", None, None)
    try:
        with pytest.raises(errors.MethodNotAllowed) as refused:
            admit(passage, {}, POST)
        assert refused.value.headers == {"Allow": "POST"}
        gateway_config(auth__require_api_key=True)
        with pytest.raises(errors.AuthenticationFailed):
            admit(passage, {}, POST)  # the caller is refused first
    finally:
        finish(passage, 405)


def test_admitted_answers_an_open_gateway() -> None:
    passage = Passage("POST", "/v1/chat/completions", None, None)
    try:
        auth = asyncio.run(admitted(passage, {}, POST))
        assert auth.credential_consumed is False
        assert passage.cors == [(b"vary", b"origin")]  # no Origin: as django-cors-headers answers
    finally:
        finish(passage, 200)


def test_method_not_allowed(gw: LiveServer, upstream: ScriptedUpstream) -> None:
    r = httpx.get(f"{gw.url}/v1/chat/completions")
    assert r.status_code == 405
    assert r.headers["allow"] == "POST"
    assert r.json() == {
        "error": {
            "message": "Method GET is not allowed on /v1/chat/completions.",
            "type": "invalid_request_error",
            "param": None,
            "code": "method_not_allowed",
        }
    }
    assert upstream.requests == []


# --- finish: metrics, access log, 499 ---------------------------------------------------------


def test_finish_logs_499_for_a_request_never_answered() -> None:
    labels = {"route": "/v1/completions", "method": "POST", "status": "499"}
    before = REGISTRY.get_sample_value("gateway_http_requests_total", labels) or 0
    finish(Passage("POST", "/v1/completions", None, None), 0)
    assert REGISTRY.get_sample_value("gateway_http_requests_total", labels) == before + 1


# --- the serving code -------------------------------------------------------------------------


def test_the_apps_fill_the_fast_route_registry() -> None:
    assert set(fastroutes.RELAYED) >= {"/v1/chat/completions", "/v1/messages", "/v1/audio/transcriptions"}
    assert "/v1/responses" in fastroutes.HANDLERS


@pytest.mark.parametrize(
    "module", ["gateway/fastpath.py", "gateway/core/pipeline.py", "gateway/core/fastroutes.py"]
)
def test_the_serving_code_imports_no_app(module: str) -> None:
    """The fast paths' cycle is gone: the apps register their routes, the gateway imports none."""
    tree = ast.parse((ROOT / module).read_text())
    imported = [
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    ] + [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert not [name for name in imported if name.split(".")[0] in ("responses_app", "conversations_app")]
