"""Client tool translation in the shared executor path (HTTP here; the WebSocket uses the same code).

Codex declares ``namespace`` tools, ``custom`` (freeform) tools and ``{"type": "web_search"}``:
namespace members reach the model as flat functions and come back with ``namespace``; custom
tools take one string argument upstream and come back as ``custom_tool_call``; web_search is
withheld when no search provider is configured; names over 64 characters are shortened stably;
collisions are refused before inference.
"""

from __future__ import annotations

from typing import Any

import pytest

from responses_app.engine.translate import upstream_tool_name
from responses_app.models import Response
from tests.responses.conftest import Gateway, check_sdk_event
from tests.responses.scripts import call, text

MEMBERS = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}]
NAMESPACE = {"type": "namespace", "name": "crm", "description": "Customer tools.", "tools": MEMBERS}
CUSTOM = {"type": "custom", "name": "apply_patch", "description": "Apply a patch."}


def _upstream_tools(gw: Gateway, body: dict[str, Any]) -> list[tuple[str, str]]:
    if gw.wire == "responses":
        return [(t["type"], t.get("name", "")) for t in body.get("tools") or ()]
    return [(t["type"], t["function"]["name"]) for t in body.get("tools") or ()]


def test_namespace_members_are_flattened_and_restored(gw: Gateway) -> None:
    gw.script(call("crm__lookup", '{"id": 7}', call_id="call_ns"))
    events = gw.stream(
        {"model": "test-model", "input": "find 7", "tools": [NAMESPACE, {"type": "web_search"}]}
    )
    body = gw.upstream_bodies()[0]
    # Flattened, and web_search withheld: no search provider is configured.
    assert _upstream_tools(gw, body) == [("function", "crm__lookup")]
    done = next(e for e in events if e["type"] == "response.output_item.done")
    assert done["item"]["type"] == "function_call"
    assert done["item"]["name"] == "lookup" and done["item"]["namespace"] == "crm"
    assert done["item"]["arguments"] == '{"id": 7}'
    for event in events:
        check_sdk_event(event)
    final = events[-1]["response"]
    # The client's own declarations, normalized as OpenAI echoes them.
    echoed_namespace = {**NAMESPACE, "tools": [{**m, "output_schema": None} for m in MEMBERS]}
    assert final["tools"][0] == echoed_namespace
    assert final["tools"][1]["type"] == "web_search" and final["tools"][1]["search_context_size"] == "medium"


def test_custom_tool_is_one_string_argument_upstream(gw: Gateway) -> None:
    gw.script(call("apply_patch", '{"input": "*** Begin', ' Patch ***"}', call_id="call_c"))
    events = gw.stream({"model": "test-model", "input": "patch it", "tools": [CUSTOM]})
    body = gw.upstream_bodies()[0]
    tool = body["tools"][0] if gw.wire == "responses" else body["tools"][0]["function"]
    assert tool["name"] == "apply_patch"
    assert tool["parameters"] == {
        "type": "object",
        "properties": {"input": {"type": "string"}},
        "required": ["input"],
    }
    kinds = [e["type"] for e in events]
    assert "response.custom_tool_call_input.delta" in kinds
    assert "response.function_call_arguments.delta" not in kinds
    delta = [e for e in events if e["type"] == "response.custom_tool_call_input.delta"]
    assert "".join(e["delta"] for e in delta) == "*** Begin Patch ***"
    done = next(e for e in events if e["type"] == "response.custom_tool_call_input.done")
    assert done["input"] == "*** Begin Patch ***"
    item = next(e for e in events if e["type"] == "response.output_item.done")["item"]
    assert item["type"] == "custom_tool_call" and item["input"] == "*** Begin Patch ***"
    assert item["call_id"] == "call_c"
    for event in events:
        check_sdk_event(event)

    # The continuation replays the call and its output as a function call upstream.
    rid = events[-1]["response"]["id"]
    gw.script(text("patched"))
    out = [{"type": "custom_tool_call_output", "call_id": "call_c", "output": "ok"}]
    follow = gw.stream({"model": "test-model", "previous_response_id": rid, "input": out, "tools": [CUSTOM]})
    assert follow[-1]["type"] == "response.completed"
    second = gw.upstream_bodies()[1]
    if gw.wire == "responses":
        replay = [i for i in second["input"] if i["type"] in ("function_call", "function_call_output")]
        assert replay[0]["name"] == "apply_patch"
        assert replay[0]["arguments"] == '{"input":"*** Begin Patch ***"}'
        assert replay[1] == {**replay[1], "type": "function_call_output", "call_id": "call_c", "output": "ok"}
    else:
        assistant = next(m for m in second["messages"] if m["role"] == "assistant")
        assert assistant["tool_calls"][0]["function"]["arguments"] == '{"input":"*** Begin Patch ***"}'
        assert next(m for m in second["messages"] if m["role"] == "tool")["content"] == "ok"


def test_long_names_are_shortened_stably_and_restored(gw: Gateway) -> None:
    long_ns = {
        "type": "namespace",
        "name": "mcp__" + "a" * 40,
        "tools": [{"type": "function", "name": "b" * 40, "parameters": {"type": "object", "properties": {}}}],
    }
    flat = upstream_tool_name(f"mcp__{'a' * 40}__{'b' * 40}")
    assert len(flat) == 64 and flat == upstream_tool_name(f"mcp__{'a' * 40}__{'b' * 40}")
    gw.script(call(flat, "{}", call_id="call_long"))
    events = gw.stream({"model": "test-model", "input": "go", "tools": [long_ns]})
    assert _upstream_tools(gw, gw.upstream_bodies()[0]) == [("function", flat)]
    item = next(e for e in events if e["type"] == "response.output_item.done")["item"]
    assert item["name"] == "b" * 40 and item["namespace"] == "mcp__" + "a" * 40


def test_colliding_tool_names_are_refused_before_inference(gw: Gateway) -> None:
    clash = {"type": "function", "name": "crm__lookup", "parameters": {"type": "object", "properties": {}}}
    r = gw.post({"model": "test-model", "input": "x", "tools": [NAMESPACE, clash]})
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "Invalid 'tools[1]': tool 'crm__lookup' reaches the model under the same name "
        "'crm__lookup' as tool 'crm.lookup'. Tool names must be unique after namespace flattening "
        "and shortening to 64 characters.",
        "type": "invalid_request_error",
        "param": "tools[1]",
        "code": "tool_name_collision",
    }
    assert gw.upstream_bodies() == []


SHELL = {"type": "shell"}
SHELL_OUTPUT = [{"stdout": "a.txt\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]


def test_shell_tool_is_a_function_upstream_and_its_call_a_shell_call(gw: Gateway) -> None:
    gw.script(call("shell", '{"commands": ["ls",', ' "pwd"], "timeout_ms": 5000}', call_id="call_sh"))
    events = gw.stream({"model": "test-model", "input": "list files", "tools": [SHELL]})
    body = gw.upstream_bodies()[0]
    tool = body["tools"][0] if gw.wire == "responses" else body["tools"][0]["function"]
    assert tool["name"] == "shell" and tool["parameters"]["required"] == ["commands"]
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" not in kinds  # the public item is a shell_call
    added = next(e for e in events if e["type"] == "response.output_item.added")["item"]
    done = next(e for e in events if e["type"] == "response.output_item.done")["item"]
    assert added == done
    assert done["id"].startswith("sh_")
    assert done == {
        "id": done["id"],
        "type": "shell_call",
        "call_id": "call_sh",
        "action": {"commands": ["ls", "pwd"], "timeout_ms": 5000, "max_output_length": None},
        "status": "completed",
    }
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["output"] == [done]
    for event in events:
        check_sdk_event(event)

    # Its output is validated like a function output, and reaches the model as one.
    rid = final["id"]
    missing = gw.post(
        {"model": "test-model", "previous_response_id": rid, "input": "go on", "tools": [SHELL]}
    )
    assert missing.status_code == 400
    assert missing.json()["error"]["message"] == "No tool output found for function call call_sh."
    stray = [{"type": "shell_call_output", "call_id": "call_nope", "output": SHELL_OUTPUT}]
    refused = gw.post({"model": "test-model", "previous_response_id": rid, "input": stray, "tools": [SHELL]})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == (
        "No tool call found for function call output with call_id call_nope."
    )
    gw.script(text("two files"))
    out = [{"type": "shell_call_output", "call_id": "call_sh", "output": SHELL_OUTPUT}]
    follow = gw.stream({"model": "test-model", "previous_response_id": rid, "input": out, "tools": [SHELL]})
    assert follow[-1]["type"] == "response.completed"
    second = gw.upstream_bodies()[-1]
    arguments = '{"commands":["ls","pwd"],"timeout_ms":5000,"max_output_length":null}'
    output = '[{"stdout":"a.txt\\n","stderr":"","outcome":{"type":"exit","exit_code":0}}]'
    if gw.wire == "responses":
        replay = [i for i in second["input"] if i["type"] in ("function_call", "function_call_output")]
        assert [i["type"] for i in replay] == ["function_call", "function_call_output"]
        assert replay[0]["name"] == "shell" and replay[0]["arguments"] == arguments
        assert replay[1]["call_id"] == "call_sh" and replay[1]["output"] == output
    else:
        assistant = next(m for m in second["messages"] if m["role"] == "assistant")
        assert assistant["tool_calls"][0]["function"] == {"name": "shell", "arguments": arguments}
        assert next(m for m in second["messages"] if m["role"] == "tool")["content"] == output
    listed = gw.client.responses.input_items.list(follow[-1]["response"]["id"], order="asc").data
    assert [i.type for i in listed][-1] == "shell_call_output"


TOOL_SEARCH = {"type": "tool_search", "execution": "client"}
LOADED = [
    {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}},
    {"type": "namespace", "name": "crm", "description": "Customer tools.", "tools": MEMBERS},
]


def _tool_search_output(call_id: str) -> dict[str, Any]:
    return {"type": "tool_search_output", "call_id": call_id, "execution": "client", "tools": LOADED}


def test_tool_search_is_a_function_upstream_and_its_call_a_tool_search_call(gw: Gateway) -> None:
    gw.script(call("tool_search", '{"query": ', '"weather"}', call_id="call_ts"))
    events = gw.stream({"model": "test-model", "input": "what tools?", "tools": [TOOL_SEARCH]})
    body = gw.upstream_bodies()[0]
    tool = body["tools"][0] if gw.wire == "responses" else body["tools"][0]["function"]
    assert tool["name"] == "tool_search"
    assert tool["parameters"]["required"] == ["query"] and tool["description"]
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" not in kinds  # the public item is a tool_search_call
    added = next(e for e in events if e["type"] == "response.output_item.added")["item"]
    done = next(e for e in events if e["type"] == "response.output_item.done")["item"]
    assert added == done
    assert done["id"].startswith("tsc_")
    assert done == {
        "id": done["id"],
        "type": "tool_search_call",
        "call_id": "call_ts",
        "arguments": {"query": "weather"},
        "execution": "client",
        "status": "completed",
    }
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["output"] == [done]
    assert final["tools"] == [TOOL_SEARCH]
    for event in events:
        check_sdk_event(event)

    # Its output is validated like a function output.
    rid = final["id"]
    missing = gw.post(
        {"model": "test-model", "previous_response_id": rid, "input": "go on", "tools": [TOOL_SEARCH]}
    )
    assert missing.status_code == 400
    assert missing.json()["error"]["message"] == "No tool output found for function call call_ts."
    stray = [_tool_search_output("call_nope")]
    refused = gw.post(
        {"model": "test-model", "previous_response_id": rid, "input": stray, "tools": [TOOL_SEARCH]}
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == (
        "No tool call found for function call output with call_id call_nope."
    )

    # The output reaches the model as the function's output, and the tools it loaded become
    # callable: a call of one comes back in its public shape (namespace restored).
    gw.script(call("crm__lookup", '{"id": 7}', call_id="call_crm"))
    loaded = [_tool_search_output("call_ts")]
    follow = gw.stream(
        {"model": "test-model", "previous_response_id": rid, "input": loaded, "tools": [TOOL_SEARCH]}
    )
    assert follow[-1]["type"] == "response.completed"
    second = gw.upstream_bodies()[-1]
    assert [name for _, name in _upstream_tools(gw, second)] == ["tool_search", "get_weather", "crm__lookup"]
    output = (
        '[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{}}},'
        '{"type":"namespace","name":"crm","description":"Customer tools.","tools":'
        '[{"type":"function","name":"lookup","parameters":{"type":"object","properties":{}}}]}]'
    )
    if gw.wire == "responses":
        replay = [i for i in second["input"] if i["type"] in ("function_call", "function_call_output")]
        assert [i["type"] for i in replay] == ["function_call", "function_call_output"]
        assert replay[0]["name"] == "tool_search" and replay[0]["arguments"] == '{"query":"weather"}'
        assert replay[1]["call_id"] == "call_ts" and replay[1]["output"] == output
    else:
        assistant = next(m for m in second["messages"] if m["role"] == "assistant")
        assert assistant["tool_calls"][0]["function"] == {
            "name": "tool_search",
            "arguments": '{"query":"weather"}',
        }
        assert next(m for m in second["messages"] if m["role"] == "tool")["content"] == output
    item = next(e for e in follow if e["type"] == "response.output_item.done")["item"]
    assert item["type"] == "function_call" and item["name"] == "lookup" and item["namespace"] == "crm"
    for event in follow:
        check_sdk_event(event)
    # The loaded tools are not echoed: only the client's own declarations are.
    assert follow[-1]["response"]["tools"] == [TOOL_SEARCH]
    listed = gw.client.responses.input_items.list(follow[-1]["response"]["id"], order="asc").data
    assert [i.type for i in listed][-1] == "tool_search_output"

    # A continuation further down the chain still offers the loaded tools.
    gw.script(text("done"))
    done_out = [{"type": "function_call_output", "call_id": "call_crm", "output": "{}"}]
    third = gw.stream(
        {
            "model": "test-model",
            "previous_response_id": follow[-1]["response"]["id"],
            "input": done_out,
            "tools": [TOOL_SEARCH],
        }
    )
    assert third[-1]["type"] == "response.completed"
    names = [name for _, name in _upstream_tools(gw, gw.upstream_bodies()[-1])]
    assert names == ["tool_search", "get_weather", "crm__lookup"]


def test_tool_search_declared_description_and_parameters_reach_the_model(gw: Gateway) -> None:
    schema = {"type": "object", "properties": {"goal": {"type": "string"}}, "required": ["goal"]}
    declared = {**TOOL_SEARCH, "description": "Find deferred tools.", "parameters": schema}
    gw.script(call("tool_search", '{"goal": "crm"}', call_id="call_ts2"))
    events = gw.stream({"model": "test-model", "input": "x", "tools": [declared]})
    body = gw.upstream_bodies()[0]
    tool = body["tools"][0] if gw.wire == "responses" else body["tools"][0]["function"]
    assert tool == {
        **({"type": "function"} if gw.wire == "responses" else {}),
        "name": "tool_search",
        "description": "Find deferred tools.",
        "parameters": schema,
    }
    done = next(e for e in events if e["type"] == "response.output_item.done")["item"]
    assert done["arguments"] == {"goal": "crm"}


def test_tool_search_state_routes_to_the_executor(gw: Gateway) -> None:
    # store: false with function tools only would go straight upstream; tool-search items do not.
    gw.script(text("ok"))
    items = [
        {"type": "tool_search_call", "call_id": "c1", "arguments": {"query": "w"}, "execution": "client"},
        _tool_search_output("c1"),
        {"role": "user", "content": "now call it"},
    ]
    r = gw.post({"model": "test-model", "store": False, "input": items, "tools": [LOADED[0]]})
    assert r.status_code == 200, r.text
    body = gw.upstream_bodies()[0]
    # The executor translated the items (direct routing would have passed them on as sent).
    if gw.wire == "responses":
        assert [i["type"] for i in body["input"]][:2] == ["function_call", "function_call_output"]
        assert body["input"][0]["name"] == "tool_search"
    else:
        assert body["messages"][0]["tool_calls"][0]["function"]["name"] == "tool_search"
    # The loaded tool (already declared) is offered once.
    assert [name for _, name in _upstream_tools(gw, body)] == ["get_weather", "crm__lookup"]


_SEARCH_CALL = {"type": "tool_search_call", "call_id": "c1", "arguments": {}, "execution": "client"}
TOOL_SEARCH_REFUSALS: list[tuple[dict[str, Any], str, str, str]] = [
    (
        {"tools": [{**TOOL_SEARCH, "parameters": 5}]},
        "invalid_type",
        "tools[0].parameters",
        "Invalid type for 'tools[0].parameters': expected an object, but got an integer instead.",
    ),
    (
        {"tools": [{"type": "tool_search", "execution": "both"}]},
        "invalid_value",
        "tools[0].execution",
        "Invalid value: 'both'. Supported values are: 'server' and 'client'.",
    ),
    (
        {"input": [{**_SEARCH_CALL, "call_id": None}]},
        "missing_required_parameter",
        "input[0].call_id",
        "Missing required parameter: 'input[0].call_id'.",
    ),
    (
        {"input": [_SEARCH_CALL, {**_tool_search_output("c1"), "tools": [{"type": "web_search"}]}]},
        "unsupported_value",
        "input[1].tools[0].type",
        "Invalid value: 'web_search'. A client tool search can load 'function', 'custom' and "
        "'namespace' tools only.",
    ),
    (
        {"input": [_SEARCH_CALL, {**_tool_search_output("c1"), "tools": [{**LOADED[0], "parameters": 5}]}]},
        "invalid_type",
        "input[1].tools[0].parameters",
        "Invalid type for 'input[1].tools[0].parameters': expected an object, but got an integer instead.",
    ),
    (
        {"input": [_SEARCH_CALL, {**_tool_search_output("c1"), "tools": [{**LOADED[1], "async": True}]}]},
        "unknown_parameter",  # async is a member's flag, never the namespace's (issue 22)
        "input[1].tools[0].async",
        "Unknown parameter: 'input[1].tools[0].async'.",
    ),
    (
        {"input": [_SEARCH_CALL]},
        "invalid_request_error",  # OpenAI's pairing rule: no code
        "input",
        "No tool output found for function call c1.",
    ),
    (
        {"input": [_tool_search_output("c9")]},
        "invalid_request_error",
        "input",
        "No tool call found for function call output with call_id c9.",
    ),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("fields", "code", "param", "message"), TOOL_SEARCH_REFUSALS)
@pytest.mark.parametrize("stream", [False, True])
def test_tool_search_refusals_store_nothing(
    gw: Gateway, fields: dict[str, Any], code: str, param: str, message: str, stream: bool
) -> None:
    gw.script(text("never"))
    r = gw.post({"model": "test-model", "input": "x", "tools": [TOOL_SEARCH], "stream": stream, **fields})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["message"] == message and error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert error["code"] == (None if code == "invalid_request_error" else code)
    assert gw.upstream_bodies() == []
    assert Response.objects.count() == 0


def test_deferred_tools_reach_the_model_only_once_loaded(gw: Gateway) -> None:
    deferred = {**LOADED[0], "defer_loading": True}
    lazy_member = {**MEMBERS[0], "name": "archive", "defer_loading": True}
    namespace = {**NAMESPACE, "tools": [*MEMBERS, lazy_member]}
    tools = [TOOL_SEARCH, deferred, namespace]
    gw.script(call("tool_search", '{"query": "weather"}', call_id="call_ts"))
    first = gw.post({"model": "test-model", "input": "weather?", "tools": tools}).json()
    names = [name for _, name in _upstream_tools(gw, gw.upstream_bodies()[0])]
    assert names == ["tool_search", "crm__lookup"]  # the deferred ones are withheld
    assert first["tools"][1]["defer_loading"] is True  # echoed as declared
    gw.script(call("get_weather", "{}", call_id="call_w"))
    second = gw.post(
        {
            "model": "test-model",
            "previous_response_id": first["id"],
            "input": [_tool_search_output("call_ts")],
            "tools": tools,
        }
    ).json()
    names = [name for _, name in _upstream_tools(gw, gw.upstream_bodies()[1])]
    assert "get_weather" in names and "crm__archive" not in names
    assert second["output"][0]["type"] == "function_call" and second["output"][0]["name"] == "get_weather"
