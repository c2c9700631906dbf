"""Routing: direct pass-through for stateless function-only requests, the executor for the rest."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from responses_app.models import Response
from tests.responses.conftest import Gateway, sse_events
from tests.responses.scripts import Script, handler, responses_events, text


@pytest.fixture
def wire() -> str:
    return "responses"


TOOLS = [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}]


def test_direct_stream_is_relayed_byte_for_byte(gw: Gateway, gateway_config: Any) -> None:
    gateway_config(llm_api_base=gw.upstream.url, upstream_api="responses")
    script = Script([text("pass", "through")])
    gw.upstream.script("/v1/responses", handler(script, "responses"))
    body = orjson.dumps(
        {"model": "m", "input": "x", "store": False, "stream": True, "tools": TOOLS, "top_k": 3}
    )
    r = httpx.post(f"{gw.url}/v1/responses", content=body, headers={"content-type": "application/json"})
    events = sse_events(r)
    assert gw.upstream.last("/v1/responses").body == body
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.completed"
    # The upstream's own ids and events (vLLM's reasoning_part etc.) come back unchanged.
    expected_types = [kind for kind, _ in responses_events(script, {})]
    assert [e["type"] for e in events] == expected_types
    assert Response.objects.count() == 0


def test_store_false_with_chat_upstream_uses_executor(gw: Gateway, gateway_config: Any) -> None:
    gateway_config(llm_api_base=gw.upstream.url, upstream_api="chat_completions")
    gw.upstream.script("/v1/chat/completions", handler(Script([text("via chat")]), "chat_completions"))
    r = gw.post({"model": "m", "input": "x", "store": False, "tools": TOOLS})
    assert r.status_code == 200
    body = r.json()
    assert body["id"].startswith("resp_")
    assert body["output"][0]["content"][0]["text"] == "via chat"
    assert body["store"] is False
    assert Response.objects.count() == 0
    assert httpx.get(f"{gw.url}/v1/responses/{body['id']}").status_code == 404


def test_store_false_with_builtin_tool_uses_executor(gw: Gateway, gateway_config: Any) -> None:
    gateway_config(llm_api_base=gw.upstream.url, upstream_api="responses")
    gw.upstream.script("/v1/responses", handler(Script([text("typed")]), "responses"))
    r = gw.post({"model": "m", "input": "x", "store": False, "tools": [{"type": "web_search"}]})
    body = r.json()
    assert body["object"] == "response"
    assert body["output"][0]["id"].startswith("msg_")  # our ids: the executor assembled it
    sent = gw.upstream.last("/v1/responses").json()
    assert sent["store"] is False
    assert sent["input"][0]["content"] == [{"type": "input_text", "text": "x"}]


def test_chat_wire_merges_system_and_developer(gw: Gateway, gateway_config: Any) -> None:
    gateway_config(llm_api_base=gw.upstream.url, upstream_api="chat_completions")
    gw.upstream.script("/v1/chat/completions", handler(Script([text("ok")]), "chat_completions"))
    gw.post(
        {
            "model": "m",
            "instructions": "Rule one.",
            "input": [
                {"role": "system", "content": "Rule two."},
                {"role": "user", "content": "Hi"},
                {"role": "developer", "content": [{"type": "input_text", "text": "Rule three."}]},
            ],
        }
    )
    messages = gw.upstream.last("/v1/chat/completions").json()["messages"]
    assert messages == [
        {"role": "system", "content": "Rule one.\n\nRule two.\n\nRule three."},
        {"role": "user", "content": "Hi"},
    ]


@pytest.mark.parametrize("tier", ["fast", "ultrafast"])
def test_direct_forwards_any_service_tier_byte_for_byte(gw: Gateway, gateway_config: Any, tier: str) -> None:
    gateway_config(llm_api_base=gw.upstream.url, upstream_api="responses")
    gw.upstream.script("/v1/responses", handler(Script([text("ok")], service_tier=tier), "responses"))
    body = orjson.dumps({"model": "m", "input": "x", "store": False, "service_tier": tier})
    r = httpx.post(f"{gw.url}/v1/responses", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert gw.upstream.last("/v1/responses").body == body
    assert Response.objects.count() == 0


GATEWAY_OWNED = [
    {"context_management": []},
    {"context_management": None},
    {"multi_agent": {"enabled": False}},
    {"multi_agent": None},
    {"conversation": None},
    {"background_options": None},
    {"stream_options": None},
    {"client_metadata": {}},
    {"generate": True},
    {"stream_id": None},
]


@pytest.mark.parametrize("owned", GATEWAY_OWNED)
@pytest.mark.parametrize("stream", [False, True])
def test_gateway_owned_fields_never_reach_the_upstream_whatever_their_value(
    gw: Gateway, gateway_config: Any, owned: dict[str, Any], stream: bool
) -> None:
    """A stateless function-only request with a gateway-owned field, empty or off, runs on the
    executor (the direct path is byte for byte and would hand the field to vLLM raw)."""
    gateway_config(llm_api_base=gw.upstream.url, upstream_api="responses")
    gw.upstream.script("/v1/responses", handler(Script([text("typed")]), "responses"))
    body = {"model": "m", "input": "x", "store": False, "tools": TOOLS, "stream": stream, **owned}
    r = httpx.post(f"{gw.url}/v1/responses", json=body, timeout=30)
    assert r.status_code == 200, r.text
    final = sse_events(r)[-1]["response"] if stream else r.json()
    assert final["output"][0]["id"].startswith("msg_")  # our ids: the executor assembled it
    sent = gw.upstream.last("/v1/responses").json()
    assert not set(owned) & set(sent), sent
    assert Response.objects.count() == 0


@pytest.mark.parametrize("upstream_api", ["responses", "chat_completions"])
def test_a_disabled_multi_agent_never_reaches_the_upstream_of_a_stored_response(
    gw: Gateway, gateway_config: Any, upstream_api: str
) -> None:
    gateway_config(llm_api_base=gw.upstream.url, upstream_api=upstream_api)
    path = "/v1/responses" if upstream_api == "responses" else "/v1/chat/completions"
    gw.upstream.script(path, handler(Script([text("ok")]), upstream_api))
    r = gw.post({"model": "m", "input": "x", "multi_agent": {"enabled": False}, "context_management": []})
    assert r.status_code == 200, r.text
    sent = gw.upstream.last(path).json()
    assert "multi_agent" not in sent and "context_management" not in sent
