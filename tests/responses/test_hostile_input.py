"""Hostile client input is a 400 before inference, the same on SQLite and PostgreSQL.

One parametrized test per family (content parts, replayed items, tool declarations, U+0000, column
lengths), each over JSON, SSE, background and WebSocket: the exact envelope with ``param`` pointing
at the element, nothing sent upstream, nothing stored, no row left behind.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from conversations_app.models import Conversation, Item
from responses_app.models import Response
from tests.responses.conftest import Gateway
from tests.responses.wsutil import Client, connect, create

TRANSPORTS = ["json", "sse", "background", "websocket"]


@pytest.fixture
def wire() -> str:
    return "responses"


def _refused(gw: Gateway, transport: str, body: dict[str, Any]) -> dict[str, Any]:
    """The error the gateway answered ``body`` with over ``transport`` (status checked)."""
    body = {"model": "m", **body}
    if transport == "websocket":

        async def scenario() -> dict[str, Any]:
            async with await connect(gw.url) as ws:
                c = Client(ws)
                await c.send(create(**body))
                event = await c.recv()
                await c.nothing_more(0.2)
                return event

        event = asyncio.run(scenario())
        assert set(event) == {"type", "status", "error"}, event
        assert event["type"] == "error" and event["status"] == 400
        return dict(event["error"])
    if transport == "sse":
        body["stream"] = True
    elif transport == "background":
        body["background"] = True
    r = httpx.post(f"{gw.url}/v1/responses", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/json")  # refused before any stream byte
    error = r.json()
    assert set(error) == {"error"}
    return dict(error["error"])


def _check(gw: Gateway, error: dict[str, Any], param: str | None, code: str, message: str | None) -> None:
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code), error
    if message is not None:
        assert error["message"] == message
    assert gw.upstream_bodies() == []  # refused before inference
    assert not Response.objects.exists() and not Item.objects.exists()  # nothing stored, nothing stuck


def _type(param: str, expected: str, got: str) -> tuple[str, str, str]:
    return param, "invalid_type", f"Invalid type for '{param}': expected {expected}, but got {got} instead."


def _user(content: Any) -> dict[str, Any]:
    return {"input": [{"role": "user", "content": content}]}


CONTENT_PARTS = {
    "number": (_user(5), _type("input[0].content", "a string or an array", "an integer")),
    "object": (_user({"a": 1}), _type("input[0].content", "a string or an array", "an object")),
    "boolean": (_user(True), _type("input[0].content", "a string or an array", "a boolean")),
    "string_part": (_user(["x"]), _type("input[0].content[0]", "an object", "a string")),
    "null_part": (_user([None]), _type("input[0].content[0]", "an object", "null")),
    "array_part": (_user([[1]]), _type("input[0].content[0]", "an object", "an array")),
    "text_number": (
        _user([{"type": "input_text", "text": 5}]),
        _type("input[0].content[0].text", "a string", "an integer"),
    ),
    "text_missing": (
        _user([{"type": "input_text"}]),
        ("input[0].content[0].text", "missing_required_parameter", None),
    ),
    "image_url_number": (
        _user([{"type": "input_image", "image_url": 5}]),
        _type("input[0].content[0].image_url", "a string", "an integer"),
    ),
    "typed_message": (
        {"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": []}]}]},
        _type("input[0].content[0].text", "a string", "an array"),
    ),
    "item_is_string": ({"input": ["hi"]}, _type("input[0]", "an object", "a string")),
    "role_unknown": (
        {"input": [{"role": "robot", "content": "x"}]},
        ("input[0].role", "invalid_value", None),
    ),
}

REPLAYED_ITEMS = {
    "web_search_action_number": (
        {"input": [{"type": "web_search_call", "id": "ws_1", "status": "completed", "action": 5}]},
        _type("input[0].action", "an object", "an integer"),
    ),
    "web_search_queries_string": (
        {
            "input": [
                {
                    "type": "web_search_call",
                    "id": "ws_1",
                    "status": "completed",
                    "action": {"type": "search", "queries": "q"},
                }
            ]
        },
        _type("input[0].action.queries", "an array", "a string"),
    ),
    "web_search_source_url_number": (
        {
            "input": [
                {
                    "type": "web_search_call",
                    "id": "ws_1",
                    "status": "completed",
                    "action": {"type": "search", "sources": [{"type": "url", "url": 5}]},
                }
            ]
        },
        _type("input[0].action.sources[0].url", "a string", "an integer"),
    ),
    "code_interpreter_code_number": (
        {"input": [{"type": "code_interpreter_call", "id": "ci_1", "status": "completed", "code": 5}]},
        _type("input[0].code", "a string", "an integer"),
    ),
    "code_interpreter_outputs_number": (
        {"input": [{"type": "code_interpreter_call", "id": "ci_1", "status": "completed", "outputs": 5}]},
        _type("input[0].outputs", "an array", "an integer"),
    ),
    "code_interpreter_logs_number": (
        {
            "input": [
                {"type": "code_interpreter_call", "id": "ci_1", "outputs": [{"type": "logs", "logs": 5}]}
            ]
        },
        _type("input[0].outputs[0].logs", "a string", "an integer"),
    ),
    "mcp_call_arguments_object": (
        {"input": [{"type": "mcp_call", "id": "mcp_1", "server_label": "s", "name": "t", "arguments": {}}]},
        _type("input[0].arguments", "a string", "an object"),
    ),
    "mcp_approval_approve_string": (
        {"input": [{"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": "yes"}]},
        _type("input[0].approve", "a boolean", "a string"),
    ),
    "function_call_arguments_object": (
        {"input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": {"a": 1}}]},
        _type("input[0].arguments", "a string", "an object"),
    ),
    "function_call_name_number": (
        {"input": [{"type": "function_call", "call_id": "c1", "name": 5, "arguments": "{}"}]},
        _type("input[0].name", "a string", "an integer"),
    ),
    "function_output_number": (
        {"input": [{"type": "function_call_output", "call_id": "c1", "output": 5}]},
        _type("input[0].output", "a string or an array", "an integer"),
    ),
    "reasoning_summary_number": (
        {"input": [{"type": "reasoning", "id": "rs_1", "summary": 5}]},
        _type("input[0].summary", "an array", "an integer"),
    ),
    "private_model_view": (
        {"input": [{"type": "web_search_call", "id": "ws_1", "status": "completed", "_gateway": {}}]},
        ("input[0]._gateway", "unknown_parameter", "Unknown parameter: 'input[0]._gateway'."),
    ),
    "local_shell_command_string": (
        {
            "input": [
                {
                    "type": "local_shell_call",
                    "id": "lsc_1",
                    "call_id": "c",
                    "action": {"type": "exec", "command": "ls"},
                }
            ]
        },
        _type("input[0].action.command", "an array", "a string"),
    ),
    "computer_output_number": (
        {"input": [{"type": "computer_call_output", "call_id": "c", "output": 5}]},
        _type("input[0].output", "an object", "an integer"),
    ),
    "apply_patch_path_number": (
        {
            "input": [
                {"type": "apply_patch_call", "call_id": "c", "operation": {"type": "delete_file", "path": 5}}
            ]
        },
        _type("input[0].operation.path", "a string", "an integer"),
    ),
    "compaction_content_number": (
        {"input": [{"type": "compaction", "encrypted_content": 5}]},
        _type("input[0].encrypted_content", "a string", "an integer"),
    ),
    "custom_call_input_number": (
        {"input": [{"type": "custom_tool_call", "call_id": "c1", "name": "f", "input": 5}]},
        _type("input[0].input", "a string", "an integer"),
    ),
}

TOOL_DECLARATIONS = {
    "namespace_tools_number": (
        {"tools": [{"type": "namespace", "name": "n", "description": "d", "tools": 5}]},
        _type("tools[0].tools", "an array", "an integer"),
    ),
    "namespace_member_string": (
        {"tools": [{"type": "namespace", "name": "n", "description": "d", "tools": ["f"]}]},
        _type("tools[0].tools[0]", "an object", "a string"),
    ),
    "namespace_member_name_number": (
        {"tools": [{"type": "namespace", "name": "n", "tools": [{"type": "function", "name": 5}]}]},
        _type("tools[0].tools[0].name", "a string", "an integer"),
    ),
    "namespace_member_type": (
        {"tools": [{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}]},
        (
            "tools[0].tools[0].type",
            "invalid_value",
            "Invalid value: 'web_search'. Supported values are: 'function' and 'custom'.",
        ),
    ),
    "namespace_name_number": (
        {"tools": [{"type": "namespace", "name": 5, "tools": []}]},
        _type("tools[0].name", "a string", "an integer"),
    ),
    "function_parameters_number": (
        {"tools": [{"type": "function", "name": "f", "parameters": 5}]},
        _type("tools[0].parameters", "an object", "an integer"),
    ),
    "function_strict_string": (
        {"tools": [{"type": "function", "name": "f", "strict": "yes"}]},
        _type("tools[0].strict", "a boolean", "a string"),
    ),
    "function_description_number": (
        {"tools": [{"type": "function", "name": "f", "description": 5}]},
        _type("tools[0].description", "a string", "an integer"),
    ),
    "custom_format_number": (
        {"tools": [{"type": "custom", "name": "c", "format": 5}]},
        _type("tools[0].format", "an object", "an integer"),
    ),
}


def _nul(param: str) -> tuple[str, str, str]:
    return (
        param,
        "invalid_value",
        f"Invalid '{param}': strings must not contain U+0000, which this service cannot store.",
    )


NUL = "a\u0000b"
CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
NUL_FIELDS = {
    "input_string": ({"input": NUL}, _nul("input")),
    "input_text": (_user([{"type": "input_text", "text": NUL}]), _nul("input[0].content[0].text")),
    "instructions": ({"input": "x", "instructions": NUL}, _nul("instructions")),
    "metadata_value": ({"input": "x", "metadata": {"k": NUL}}, _nul("metadata.k")),
    "metadata_key": ({"input": "x", "metadata": {NUL: "v"}}, _nul("metadata")),
    "model": ({"input": "x", "model": NUL}, _nul("model")),
    "user": ({"input": "x", "user": NUL}, _nul("user")),
    "prompt_cache_key": ({"input": "x", "prompt_cache_key": NUL}, _nul("prompt_cache_key")),
    "tool_name": ({"input": "x", "tools": [{"type": "function", "name": NUL}]}, _nul("tools[0].name")),
    "call_arguments": ({"input": [{**CALL, "arguments": NUL}, OUTPUT]}, _nul("input[0].arguments")),
    "call_id": ({"input": [{**CALL, "call_id": NUL}, {**OUTPUT, "call_id": NUL}]}, _nul("input[0].call_id")),
    "previous_response_id": (
        {"input": "x", "previous_response_id": "resp_\u0000"},
        _nul("previous_response_id"),
    ),
    "conversation": ({"input": "x", "conversation": "conv_\u0000"}, _nul("conversation")),
    "conversation_object": ({"input": "x", "conversation": {"id": "conv_\u0000"}}, _nul("conversation.id")),
    "item_reference": ({"input": [{"type": "item_reference", "id": "msg_\u0000"}]}, _nul("input[0].id")),
    "item_id": ({"input": [{"role": "user", "content": "x", "id": "msg_\u0000"}]}, _nul("input[0].id")),
}

LENGTHS = {
    "model": (
        {"input": "x", "model": "m" * 257},
        (
            "model",
            "string_above_max_length",
            "Invalid 'model': string too long. Expected a string with maximum length 256, "
            "but got a string with length 257 instead.",
        ),
    ),
    "item_type": (
        {"input": [{"type": "t" * 65}]},
        ("input[0].type", "string_above_max_length", None),
    ),
    "conversation_id": (
        {"input": "x", "conversation": "conv_" + "a" * 200},
        ("conversation", "invalid_value", None),
    ),
}


def _cases(family: dict[str, Any]) -> list[Any]:
    return [
        pytest.param(transport, name, id=f"{name}-{transport}") for name in family for transport in TRANSPORTS
    ]


@pytest.mark.parametrize(("transport", "name"), _cases(CONTENT_PARTS))
def test_malformed_content_parts(gw: Gateway, transport: str, name: str) -> None:
    body, expected = CONTENT_PARTS[name]
    _check(gw, _refused(gw, transport, body), *expected)


@pytest.mark.parametrize(("transport", "name"), _cases(REPLAYED_ITEMS))
def test_malformed_replayed_items(gw: Gateway, transport: str, name: str) -> None:
    body, expected = REPLAYED_ITEMS[name]
    _check(gw, _refused(gw, transport, body), *expected)


@pytest.mark.parametrize(("transport", "name"), _cases(TOOL_DECLARATIONS))
def test_malformed_tool_declarations(gw: Gateway, transport: str, name: str) -> None:
    body, expected = TOOL_DECLARATIONS[name]
    _check(gw, _refused(gw, transport, {"input": "x", **body}), *expected)


@pytest.mark.parametrize(("transport", "name"), _cases(NUL_FIELDS))
def test_nul_in_stored_strings_and_ids(gw: Gateway, transport: str, name: str) -> None:
    body, expected = NUL_FIELDS[name]
    _check(gw, _refused(gw, transport, body), *expected)


@pytest.mark.parametrize(("transport", "name"), _cases(LENGTHS))
def test_stored_lengths(gw: Gateway, transport: str, name: str) -> None:
    body, expected = LENGTHS[name]
    _check(gw, _refused(gw, transport, body), *expected)


@pytest.mark.parametrize(
    ("method", "path", "param"),
    [
        ("GET", "/v1/responses/resp_%00", "response_id"),
        ("DELETE", "/v1/responses/resp_%00", "response_id"),
        ("GET", "/v1/responses/resp_%00/input_items", "response_id"),
        ("GET", "/v1/responses/resp_1/input_items?after=msg_%00", "after"),
        ("POST", "/v1/responses/resp_%00/cancel", "response_id"),
        ("GET", "/v1/conversations/conv_%00", "conversation_id"),
        ("GET", "/v1/conversations/conv_%00/items", "conversation_id"),
        ("GET", "/v1/conversations/conv_1/items/msg_%00", "item_id"),
        ("GET", "/v1/conversations/conv_1/items?after=msg_%00", "after"),
    ],
)
def test_nul_in_url_ids(gw: Gateway, method: str, path: str, param: str) -> None:
    r = httpx.request(method, f"{gw.url}{path}", timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert r.json()["error"]["code"] == "invalid_value"
    assert "U+0000" in r.json()["error"]["message"]
    assert not Conversation.objects.exists()


def test_replayed_tool_items_are_stored_as_sent(gw: Gateway) -> None:
    """Typed checking adds nothing to a stored item: optional members the client left out stay out."""
    item = {
        "type": "web_search_call",
        "id": "ws_1",
        "status": "completed",
        "action": {"type": "search", "query": "q"},
    }
    r = httpx.post(f"{gw.url}/v1/conversations", json={"items": [item]}, timeout=30)
    assert r.status_code == 200, r.text
    listed = httpx.get(f"{gw.url}/v1/conversations/{r.json()['id']}/items", timeout=30).json()
    assert listed["data"] == [item]
