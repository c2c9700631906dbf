"""The OpenAPI document (``gateway.core.openapi``): every ``/v1`` route, generated from the code, served
publicly at ``/v1/openapi.json`` with a Swagger UI on bundled assets at ``/docs/``."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema

from gateway.core import fastroutes, openapi
from inference_app.upstream.forward import Route
from passthrough_app.routes import VLLM_ROUTES
from tests.servers import LiveServer

# Methods each route serves, as the views declare them (Django views: ``allow_methods``; DRF views:
# their handlers; fast routes: POST). Non-/v1 routes and the catch-all are not part of the API.
NOT_API = {"/v1/openapi.json"}


def _django_routes() -> Iterator[tuple[str, Any]]:
    def walk(patterns: list[Any], prefix: str) -> Iterator[tuple[str, Any]]:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
            elif isinstance(pattern, URLPattern):
                yield prefix + str(pattern.pattern), pattern.callback

    yield from walk(get_resolver().url_patterns, "")


def _openapi_path(route: str) -> str:
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)


def _methods(callback: Any) -> set[str]:
    cls = getattr(callback, "cls", None)
    if cls is not None:  # a DRF view (gateway.core.drf.async_view keeps as_view's attributes)
        return {m for m in ("get", "post", "delete") if hasattr(cls, m)}
    return {m.lower() for m in callback.allowed_methods}  # gateway.core.http.allow_methods


def code_routes() -> dict[str, set[str]]:
    """Every ``/v1`` operation the code serves: the URL conf and the routes served below Django."""
    routes: dict[str, set[str]] = {}
    for route, callback in _django_routes():
        path = _openapi_path(route)
        if not path.startswith("/v1/") or "(" in path or "^" in path or path in NOT_API:
            continue
        routes.setdefault(path, set()).update(_methods(callback))
    for path in [*fastroutes.RELAYED, *fastroutes.HANDLERS]:  # the fast-route registry (all POST)
        routes.setdefault(path, set()).add("post")
    return routes


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    generated: dict[str, Any] = SchemaGenerator().get_schema(request=None, public=True)
    return generated


def test_document_covers_every_route_in_the_code(document: dict[str, Any]) -> None:
    documented = {path: set(ops) for path, ops in document["paths"].items()}
    assert documented == code_routes()
    assert set(VLLM_ROUTES) <= set(documented)  # vLLM's own routes too, though not under /v1


def test_a_relayed_route_without_types_is_documented_as_the_upstreams_json() -> None:
    fastroutes.relay("/v1/extra/thing", Route("/v1/extra/thing"))  # as [passthrough] extra_routes does
    openapi.lean_paths.cache_clear()
    try:
        paths, _ = openapi.lean_paths()
    finally:
        del fastroutes.RELAYED["/v1/extra/thing"]
        openapi.lean_paths.cache_clear()
    operation = paths["/v1/extra/thing"]["post"]
    assert operation["operationId"] == "passthrough_v1_extra_thing"
    assert operation["requestBody"]["content"]["application/json"]["schema"]["type"] == "object"
    assert operation["responses"]["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/UpstreamError"
    }
    speech = paths["/v1/audio/speech"]["post"]  # a vLLM route with an SDK type
    assert {"input", "model", "voice"} <= set(
        speech["requestBody"]["content"]["application/json"]["schema"]["properties"]
    )
    assert set(speech["responses"]["200"]["content"]) == {"audio/*"}


def test_document_is_valid_openapi(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1")
    validate_schema(document)
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            assert operation.get("operationId"), (method, path)
            assert "200" in operation["responses"], (method, path)
            for status, answer in operation["responses"].items():
                assert answer.get("content"), (method, path, status)  # every answer has a body schema


def test_lean_routes_come_from_pydantic_and_sdk_types(document: dict[str, Any]) -> None:
    from openai.types.chat import ChatCompletion

    schemas = document["components"]["schemas"]
    create = document["paths"]["/v1/responses"]["post"]
    body = create["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/responses_ResponseCreateRequest"}
    assert set(schemas["responses_ResponseCreateRequest"]["properties"]) >= {"model", "input", "tools"}
    ok = create["responses"]["200"]["content"]
    assert ok["application/json"]["schema"] == {"$ref": "#/components/schemas/openai_Response"}
    assert "text/event-stream" in ok
    chat = document["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert chat["application/json"]["schema"] == {"$ref": "#/components/schemas/openai_ChatCompletion"}
    assert set(schemas["openai_ChatCompletion"]["properties"]) == set(ChatCompletion.model_fields)
    messages = document["paths"]["/v1/messages"]["post"]["responses"]["400"]["content"]
    assert messages["application/json"]["schema"] == {"$ref": "#/components/schemas/AnthropicError"}
    assert schemas["AnthropicError"]["properties"]["type"]["const"] == "error"  # Anthropic's envelope


def test_drf_views_are_described_by_their_pydantic_models(document: dict[str, Any]) -> None:
    from conversations_app.schemas import METADATA_MAX_PAIRS, ConversationCreateParams

    items = document["paths"]["/v1/conversations/{conversation_id}/items"]["get"]
    assert {p["name"] for p in items["parameters"]} == {
        "conversation_id",
        "after",
        "limit",
        "order",
        "include",
    }
    page = document["components"]["schemas"]["ConversationItemList"]
    assert set(page["required"]) == {"object", "data", "first_id", "last_id", "has_more"}
    create = document["paths"]["/v1/conversations"]["post"]["requestBody"]["content"]["application/json"]
    body = document["components"]["schemas"][create["schema"]["$ref"].rsplit("/", 1)[1]]
    assert set(body["properties"]) == set(ConversationCreateParams.model_fields)
    assert body["additionalProperties"] is False  # unknown parameters are refused
    assert body["properties"]["metadata"]["anyOf"][0]["maxProperties"] == METADATA_MAX_PAIRS
    error = items["responses"]["404"]["content"]["application/json"]["schema"]
    assert error == {"$ref": "#/components/schemas/Error"}
    links = document["paths"]["/v1/conversations"]["post"]["responses"]["200"]["links"]
    assert links["conversations_retrieve"]["parameters"] == {"conversation_id": "$response.body#/id"}


@pytest.fixture
def keyed_gateway(live_gateway: LiveServer, gateway_config: Callable[..., Any]) -> LiveServer:
    gateway_config(auth__require_api_key=True)
    return live_gateway


def test_document_and_swagger_ui_are_public_like_health(keyed_gateway: LiveServer) -> None:
    base = keyed_gateway.url
    assert httpx.post(f"{base}/v1/conversations", json={}, timeout=30).status_code == 401  # the API is not
    assert httpx.get(f"{base}/health", timeout=30).status_code == 200
    served = httpx.get(f"{base}/v1/openapi.json", timeout=120)
    assert served.status_code == 200
    assert served.headers["content-type"].startswith("application/vnd.oai.openapi+json")
    assert "/v1/conversations" in served.json()["paths"]
    ui = httpx.get(f"{base}/docs/", timeout=30)
    assert ui.status_code == 200 and "text/html" in ui.headers["content-type"]
    assert "/v1/openapi.json" in ui.text
    assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', ui.text)
    assert any("swagger-ui-bundle.js" in asset for asset in assets)
    assert not re.search(r"https?://(?!127\.0\.0\.1)", ui.text.split("</head>")[0])  # no CDN
    for asset in assets:
        assert httpx.get(f"{base}{asset}", timeout=30).status_code == 200, asset
