"""The one rule pipeline (``gateway.core.pipeline``): what ``Passage``, ``admit`` and ``finish`` do, in the
order every path applies them. The paths themselves are tested against live servers in
``test_passthrough.py``, ``test_messages.py`` and ``tests/responses/test_fastpath_cache.py``."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import pytest

from gateway.core import errors, fastroutes
from gateway.core.logging import request_id_var
from gateway.core.metrics import HTTP_IN_FLIGHT, REGISTRY
from gateway.core.middleware import GatewayASGIMiddleware
from gateway.core.pipeline import Passage, admit, admitted, finish

ROOT = Path(__file__).resolve().parents[2]
POST = frozenset({"POST"})


def _in_flight() -> float:
    return HTTP_IN_FLIGHT._value.get()  # type: ignore[attr-defined]  # a test may look inside


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


def test_the_body_ceiling_refuses_a_declared_length(gateway_config: Any) -> None:
    gateway_config(server__max_request_body_size_bytes=100)
    passage = Passage("POST", "/v1/chat/completions", None, "101")
    assert isinstance(passage.refusal, errors.GatewayError) and passage.refusal.status == 413
    finish(passage, 413)
    passage = Passage("POST", "/v1/chat/completions", None, "100")
    assert passage.refusal is None
    finish(passage, 200)


def test_finish_logs_499_for_a_request_never_answered() -> None:
    labels = {"route": "/v1/completions", "method": "POST", "status": "499"}
    before = REGISTRY.get_sample_value("gateway_http_requests_total", labels) or 0
    finish(Passage("POST", "/v1/completions", None, None), 0)
    assert REGISTRY.get_sample_value("gateway_http_requests_total", labels) == before + 1


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


def test_admitted_answers_an_open_gateway() -> None:
    passage = Passage("POST", "/v1/chat/completions", None, None)
    try:
        auth = asyncio.run(admitted(passage, {}, POST))
        assert auth.credential_consumed is False
        assert passage.cors == [(b"vary", b"origin")]  # no Origin: as django-cors-headers answers
    finally:
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
