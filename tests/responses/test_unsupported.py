"""Nothing is accepted silently: every request feature the gateway does not build is a 400, on HTTP JSON, SSE, WebSocket and direct routing, and nothing is stored or sent
upstream."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from responses_app.models import Response
from tests.responses.conftest import Gateway
from tests.responses.scripts import text
from tests.responses.wsutil import Client, connect, create

FN = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}

# (request fields, code, param): each is refused before anything happens.
REFUSALS: list[tuple[dict[str, Any], str, str]] = [
    # async is accepted on function and custom tools (and namespace members) only (issue 22).
    (
        {"tools": [{"type": "namespace", "name": "ns", "description": "d", "tools": [FN], "async": True}]},
        "unknown_parameter",
        "tools[0].async",
    ),
    ({"tools": [FN, {"type": "shell", "async": True}]}, "unknown_parameter", "tools[1].async"),
    (
        {"tools": [{"type": "tool_search", "execution": "client", "async": True}]},
        "unknown_parameter",
        "tools[0].async",
    ),
    ({"tools": [{"type": "web_search", "async": True}]}, "unknown_parameter", "tools[0].async"),
    (
        {"tools": [{"type": "code_interpreter", "container": {"type": "auto"}, "async": False}]},
        "unknown_parameter",
        "tools[0].async",
    ),
    (
        {
            "tools": [
                {"type": "mcp", "server_label": "s", "server_url": "http://127.0.0.1:9/mcp", "async": True}
            ]
        },
        "unknown_parameter",
        "tools[0].async",
    ),
    ({"tools": [{**FN, "async": "yes"}]}, "invalid_type", "tools[0].async"),
    (
        {"input": [{"type": "function_call_output", "call_id": "c1", "output": "x", "async": True}]},
        "unknown_parameter",
        "input[0].async",
    ),
    # Multi-agent with an explicit parallel_tool_calls: true and an async tool (multi-agent itself
    # is refused below).
    (
        {"multi_agent": {"enabled": True}, "parallel_tool_calls": True, "tools": [{**FN, "async": True}]},
        "unsupported_value",
        "multi_agent",
    ),
    (
        {
            "multi_agent": {"enabled": True},
            "parallel_tool_calls": True,
            "tools": [
                {"type": "namespace", "name": "ns", "description": "d", "tools": [{**FN, "async": True}]}
            ],
        },
        "unsupported_value",
        "multi_agent",
    ),
    # The gateway's own tool search (server execution, the SDK's default) takes a query, no schema.
    (
        {"tools": [FN, {"type": "tool_search", "execution": "server", "parameters": {"type": "object"}}]},
        "unsupported_parameter",
        "tools[1].parameters",
    ),
    (
        {
            "input": [
                {"type": "tool_search_call", "call_id": "ts1", "arguments": {}, "execution": "elsewhere"}
            ]
        },
        "invalid_value",
        "input[0].execution",
    ),
    (
        {
            "input": [
                {"type": "tool_search_call", "call_id": "ts1", "arguments": {}, "execution": "client"},
                {
                    "type": "tool_search_output",
                    "call_id": "ts1",
                    "execution": "client",
                    "tools": [{"type": "mcp"}],
                },
            ]
        },
        "unsupported_value",
        "input[1].tools[0].type",
    ),
    (
        {
            "input": [
                {"type": "tool_search_call", "call_id": "ts1", "arguments": {}, "execution": "client"},
                {
                    "type": "tool_search_output",
                    "call_id": "ts1",
                    "execution": "client",
                    "tools": [
                        {
                            "type": "namespace",
                            "name": "ns",
                            "description": "d",
                            "tools": [{"type": "function"}],
                        }
                    ],
                },
            ]
        },
        "missing_required_parameter",
        "input[1].tools[0].tools[0].name",
    ),
    ({"tools": [{"type": "image_generation"}]}, "unsupported_value", "tools[0].type"),
    (
        {"tools": [{"type": "computer_use_preview", "display_width": 1, "display_height": 1}]},
        "unsupported_value",
        "tools[0].type",
    ),
    ({"tools": [FN, {"type": "hologram"}]}, "invalid_value", "tools[1].type"),
    ({"input": [{"role": "user", "content": "hi"}, {"type": "hologram_call"}]}, "invalid_value", "input[1]"),
    (
        {"input": [{"type": "computer_call_output", "call_id": "c", "output": {}}]},
        "unsupported_value",  # an SDK item type for a capability the gateway does not have
        "input[0]",
    ),
    ({"prompt": {"id": "pmpt_1"}}, "unsupported_parameter", "prompt"),
    ({"moderation": {"model": "omni-moderation-latest"}}, "unsupported_parameter", "moderation"),
    ({"background_options": {"completion_window": "2h"}}, "unsupported_parameter", "background_options"),
    ({"access_programs": {"cyber": "standard"}}, "unsupported_parameter", "access_programs"),
    ({"image": {"context_compression": "auto"}}, "unsupported_parameter", "image"),
]
IDS = [param for _, _, param in REFUSALS]


def _check_refusal(status: int, error: dict[str, Any], code: str, param: str) -> None:
    assert status == 400
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["code"] == code
    assert error["param"] == param
    assert error["message"]


def _nothing_happened(gw: Gateway) -> None:
    assert gw.upstream_bodies() == []
    assert Response.objects.count() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("fields", "code", "param"), REFUSALS, ids=IDS)
@pytest.mark.parametrize("mode", ["json", "sse", "direct"])
def test_refused_over_http(gw: Gateway, fields: dict[str, Any], code: str, param: str, mode: str) -> None:
    gw.script(text("never"))
    body: dict[str, Any] = {"model": "m", "input": "hi", **fields}
    if mode == "sse":
        body["stream"] = True
    if mode == "direct":
        body["store"] = False  # what would otherwise be passed straight to the upstream
    r = gw.post(body)
    assert r.headers["content-type"].startswith("application/json")
    _check_refusal(r.status_code, r.json()["error"], code, param)
    _nothing_happened(gw)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("fields", "code", "param"), REFUSALS, ids=IDS)
def test_refused_over_websocket(gw: Gateway, fields: dict[str, Any], code: str, param: str) -> None:
    gw.script(text("never"))

    async def scenario() -> dict[str, Any]:
        async with await connect(gw.url) as ws:
            client = Client(ws)
            await client.send(create(**fields))
            return await client.recv()

    event = asyncio.run(scenario())
    assert event["type"] == "error"
    _check_refusal(event["status"], event["error"], code, param)
    _nothing_happened(gw)


@pytest.fixture
def wire() -> str:
    return "responses"  # the wire that allows direct routing


@pytest.mark.django_db(transaction=True)
def test_input_file_refused_on_the_executor_path_only(gw: Gateway) -> None:
    gw.script(text("read it"))
    content = [
        {"type": "input_text", "text": "summarise"},
        {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0="},
    ]
    r = gw.post({"model": "m", "input": [{"role": "user", "content": content}]})
    _check_refusal(r.status_code, r.json()["error"], "unsupported_parameter", "input[0].content[1]")
    _nothing_happened(gw)
    # Direct routing (stateless, function tools only) hands the upstream the body as sent.
    r = gw.post({"model": "m", "store": False, "input": [{"role": "user", "content": content}]})
    assert r.status_code == 200, r.text
    assert gw.upstream_bodies()[-1]["input"][0]["content"][1]["type"] == "input_file"


@pytest.mark.django_db(transaction=True)
def test_input_image_by_file_id_refused_on_the_executor_path(gw: Gateway) -> None:
    """An image the gateway would have to fetch from a Files API is refused, not sent as a URL."""
    gw.script(text("seen"))
    content = [
        {"type": "input_text", "text": "describe"},
        {"type": "input_image", "file_id": "file-abc123", "detail": "auto"},
    ]
    for extra in ({}, {"stream": True}):
        r = gw.post({"model": "m", "input": [{"role": "user", "content": content}], **extra})
        _check_refusal(r.status_code, r.json()["error"], "unsupported_parameter", "input[0].content[1]")
        assert "file_id" in r.json()["error"]["message"]
    r = httpx.post(
        f"{gw.url}/v1/responses/compact",
        json={"model": "m", "input": [{"role": "user", "content": content}]},
        timeout=10,
    )
    _check_refusal(r.status_code, r.json()["error"], "unsupported_parameter", "input[0].content[1]")
    _nothing_happened(gw)
    # An image given by URL still goes to the model.
    url = [{"type": "input_image", "image_url": "https://example.com/cat.png", "detail": "auto"}]
    r = gw.post({"model": "m", "input": [{"role": "user", "content": url}]})
    assert r.status_code == 200, r.text


def test_compact_route_answers_405_to_get(gw: Gateway) -> None:
    r = httpx.get(f"{gw.url}/v1/responses/compact", timeout=10)
    assert r.status_code == 405 and r.headers["allow"] == "POST"


@pytest.mark.django_db(transaction=True)
def test_async_false_and_known_tools_are_accepted(gw: Gateway) -> None:
    gw.script(text("ok"))
    r = gw.post({"model": "m", "input": "hi", "tools": [{**FN, "async": False}, {"type": "shell"}]})
    assert r.status_code == 200, r.text
