"""Client tool translation in the shared executor path (HTTP here; the WebSocket uses the same code).

Codex declares ``namespace`` tools, ``custom`` (freeform) tools and ``{"type": "web_search"}``:
namespace members reach the model as flat functions and come back with ``namespace``; custom
tools take one string argument upstream and come back as ``custom_tool_call``; web_search is
withheld when no search provider is configured; names over 64 characters are shortened stably;
collisions are refused before inference.
"""

from __future__ import annotations

from typing import Any

from responses_app.translate import upstream_tool_name
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
