"""The client-executed ``apply_patch`` and ``local_shell`` tools (issue 57), like ``shell``.

The model sees each as a function; its call comes back as the public ``apply_patch_call`` /
``local_shell_call`` (the SDK's shapes), streamed whole; the client's ``apply_patch_call_output`` /
``local_shell_call_output`` is validated like a function output and reaches the model as the
function's output. Over HTTP (JSON and SSE, stored and not) and WebSocket.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from openai.types.responses import ResponseInputItemParam
from pydantic import TypeAdapter

from responses_app.models import Response
from tests.responses.conftest import Gateway, check_sdk_event, check_sdk_response
from tests.responses.scripts import Script, call, handler, text
from tests.responses.wsutil import Client, connect, create
from tests.servers import LiveServer

PATCH = {"type": "apply_patch"}
LOCAL_SHELL = {"type": "local_shell"}
INPUT_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseInputItemParam)


def _function(gw: Gateway, body: dict[str, Any], name: str) -> dict[str, Any]:
    tools = body["tools"] if gw.wire == "responses" else [t["function"] for t in body["tools"]]
    return next(t for t in tools if t["name"] == name)


def _replay(gw: Gateway, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The replayed call (name, arguments) and its output text, as the upstream received them."""
    if gw.wire == "responses":
        pair = [i for i in body["input"] if i["type"] in ("function_call", "function_call_output")]
        assert [i["type"] for i in pair] == ["function_call", "function_call_output"]
        assert pair[0]["call_id"] == pair[1]["call_id"]
        return {"name": pair[0]["name"], "arguments": pair[0]["arguments"]}, pair[1]["output"]
    assistant = next(m for m in body["messages"] if m["role"] == "assistant")
    tool = next(m for m in body["messages"] if m["role"] == "tool")
    assert tool["tool_call_id"] == assistant["tool_calls"][0]["id"]
    return assistant["tool_calls"][0]["function"], tool["content"]


def test_apply_patch_is_a_function_upstream_and_its_call_an_apply_patch_call(gw: Gateway) -> None:
    gw.script(
        call(
            "apply_patch",
            '{"type": "update_file", "path": "src/a.py",',
            ' "diff": "@@\\n-x\\n+y\\n"}',
            call_id="call_p",
        )
    )
    events = gw.stream({"model": "test-model", "input": "fix it", "tools": [PATCH]})
    fn = _function(gw, gw.upstream_bodies()[0], "apply_patch")
    assert fn["parameters"]["required"] == ["type", "path"]
    assert fn["parameters"]["properties"]["type"]["enum"] == ["create_file", "update_file", "delete_file"]
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" not in kinds  # the public item is an apply_patch_call
    added = next(e for e in events if e["type"] == "response.output_item.added")["item"]
    done = next(e for e in events if e["type"] == "response.output_item.done")["item"]
    assert added == done and done["id"].startswith("apc_")
    assert done == {
        "id": done["id"],
        "type": "apply_patch_call",
        "call_id": "call_p",
        "operation": {"type": "update_file", "path": "src/a.py", "diff": "@@\n-x\n+y\n"},
        "status": "completed",
    }
    for event in events:
        check_sdk_event(event)
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["output"] == [done]
    assert final["tools"] == [PATCH]

    # Its output is validated like a function output, and reaches the model as one.
    rid = final["id"]
    missing = gw.post(
        {"model": "test-model", "previous_response_id": rid, "input": "go on", "tools": [PATCH]}
    )
    assert missing.status_code == 400
    assert missing.json()["error"]["message"] == "No tool output found for function call call_p."
    stray = [{"type": "apply_patch_call_output", "call_id": "call_nope", "status": "completed"}]
    refused = gw.post({"model": "test-model", "previous_response_id": rid, "input": stray, "tools": [PATCH]})
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == (
        "No tool call found for function call output with call_id call_nope."
    )
    gw.script(text("patched"))
    out = [
        {
            "type": "apply_patch_call_output",
            "call_id": "call_p",
            "status": "failed",
            "output": "hunk 1 failed",
        }
    ]
    INPUT_ITEM.validate_python(out[0])
    follow = gw.stream({"model": "test-model", "previous_response_id": rid, "input": out, "tools": [PATCH]})
    assert follow[-1]["type"] == "response.completed"
    function, output = _replay(gw, gw.upstream_bodies()[-1])
    assert function == {
        "name": "apply_patch",
        "arguments": '{"type":"update_file","path":"src/a.py","diff":"@@\\n-x\\n+y\\n"}',
    }
    assert output == '{"status":"failed","output":"hunk 1 failed"}'
    listed = gw.client.responses.input_items.list(follow[-1]["response"]["id"], order="asc").data
    assert [i.type for i in listed][-2:] == ["apply_patch_call", "apply_patch_call_output"]
    assert listed[-1].id.startswith("apco_")


def test_apply_patch_delete_file_has_no_diff_and_tool_choice_names_it(gw: Gateway) -> None:
    gw.script(call("apply_patch", '{"type": "delete_file", "path": "old.txt"}', call_id="call_d"))
    r = gw.post(
        {"model": "test-model", "input": "rm", "tools": [PATCH], "tool_choice": {"type": "apply_patch"}}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    check_sdk_response(body)
    assert body["output"][0]["operation"] == {"type": "delete_file", "path": "old.txt"}
    assert body["tool_choice"] == {"type": "apply_patch"}  # echoed as sent
    sent = gw.upstream_bodies()[0]["tool_choice"]
    assert sent == (
        {"type": "function", "name": "apply_patch"}
        if gw.wire == "responses"
        else {"type": "function", "function": {"name": "apply_patch"}}
    )


def test_local_shell_is_a_function_upstream_and_its_call_a_local_shell_call(gw: Gateway) -> None:
    gw.script(
        call(
            "local_shell",
            '{"command": ["ls", "-la"], "env": {"A": "1"},',
            ' "timeout_ms": 900}',
            call_id="call_l",
        )
    )
    events = gw.stream({"model": "test-model", "input": "list", "tools": [LOCAL_SHELL]})
    fn = _function(gw, gw.upstream_bodies()[0], "local_shell")
    assert fn["parameters"]["required"] == ["command"]
    done = next(e for e in events if e["type"] == "response.output_item.done")["item"]
    assert done["id"].startswith("lsc_")
    assert done == {
        "id": done["id"],
        "type": "local_shell_call",
        "call_id": "call_l",
        "action": {
            "type": "exec",
            "command": ["ls", "-la"],
            "env": {"A": "1"},
            "timeout_ms": 900,
            "user": None,
            "working_directory": None,
        },
        "status": "completed",
    }
    for event in events:
        check_sdk_event(event)
    rid = events[-1]["response"]["id"]

    # The SDK's output item names its call by ``id``; OpenAI's guide sends ``call_id``: both pair.
    for answer in (
        {"type": "local_shell_call_output", "id": "call_l", "output": '{"stdout": "a.txt"}'},
        {"type": "local_shell_call_output", "call_id": "call_l", "output": '{"stdout": "a.txt"}'},
    ):
        gw.script(text("one file"))
        follow = gw.stream(
            {"model": "test-model", "previous_response_id": rid, "input": [answer], "tools": [LOCAL_SHELL]}
        )
        assert follow[-1]["type"] == "response.completed"
        function, output = _replay(gw, gw.upstream_bodies()[-1])
        assert function["name"] == "local_shell"
        assert output == '{"stdout": "a.txt"}'
        listed = gw.client.responses.input_items.list(follow[-1]["response"]["id"], order="asc").data
        assert listed[-1].type == "local_shell_call_output" and listed[-1].id.startswith("lsco_")
    INPUT_ITEM.validate_python({"type": "local_shell_call_output", "id": "call_l", "output": "{}"})


def test_unstored_replay_of_calls_and_outputs_runs_through_the_executor(gw: Gateway) -> None:
    """store: false with the whole history as input (no previous_response_id): translated for the
    model, not passed on raw."""
    gw.script(text("ok"))
    items = [
        {"role": "user", "content": "fix and list"},
        {
            "type": "apply_patch_call",
            "call_id": "c1",
            "status": "completed",
            "operation": {"type": "create_file", "path": "n.txt", "diff": "+hi\n"},
        },
        {"type": "apply_patch_call_output", "call_id": "c1", "status": "completed"},
        {
            "type": "local_shell_call",
            "id": "lsc_1",
            "call_id": "c2",
            "status": "completed",
            "action": {"type": "exec", "command": ["cat", "n.txt"], "env": {}},
        },
        {"type": "local_shell_call_output", "id": "c2", "output": "hi"},
    ]
    for item in items[1:]:
        INPUT_ITEM.validate_python(item)
    r = gw.post({"model": "test-model", "store": False, "input": items, "tools": [PATCH, LOCAL_SHELL]})
    assert r.status_code == 200, r.text
    body = gw.upstream_bodies()[0]
    if gw.wire == "responses":
        seen = [(i["type"], i.get("name"), i.get("call_id")) for i in body["input"][1:]]
        assert seen == [
            ("function_call", "apply_patch", "c1"),
            ("function_call_output", None, "c1"),
            ("function_call", "local_shell", "c2"),
            ("function_call_output", None, "c2"),
        ]
        assert body["input"][2]["output"] == '{"status":"completed","output":null}'
        assert body["input"][4]["output"] == "hi"
    else:
        calls = [m for m in body["messages"] if m["role"] == "assistant"]
        assert [c["tool_calls"][0]["function"]["name"] for c in calls] == ["apply_patch", "local_shell"]
        assert [m["content"] for m in body["messages"] if m["role"] == "tool"] == [
            '{"status":"completed","output":null}',
            "hi",
        ]
    assert Response.objects.count() == 0


CALL = {
    "type": "apply_patch_call",
    "call_id": "c1",
    "status": "completed",
    "operation": {"type": "delete_file", "path": "x"},
}
REFUSALS: list[tuple[list[dict[str, Any]], str, str, str]] = [
    (
        [CALL, {"type": "apply_patch_call_output", "call_id": "c1"}],
        "missing_required_parameter",
        "input[1].status",
        "Missing required parameter: 'input[1].status'.",
    ),
    (
        [CALL, {"type": "apply_patch_call_output", "call_id": "c1", "status": "in_progress"}],
        "invalid_value",
        "input[1].status",
        "Invalid value: 'in_progress'. Supported values are: 'completed' and 'failed'.",
    ),
    (
        [{**CALL, "call_id": None}],
        "missing_required_parameter",
        "input[0].call_id",
        "Missing required parameter: 'input[0].call_id'.",
    ),
    (
        [{"type": "local_shell_call_output", "output": "x"}],
        "missing_required_parameter",
        "input[0].call_id",
        "Missing required parameter: 'input[0].call_id'.",
    ),
    (
        [{"type": "local_shell_call", "call_id": "c3", "status": "completed"}],
        "missing_required_parameter",
        "input[0].action",
        "Missing required parameter: 'input[0].action'.",
    ),
    (
        [CALL],
        "invalid_request_error",  # OpenAI's pairing rule: no code
        "input",
        "No tool output found for function call c1.",
    ),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("items", "code", "param", "message"), REFUSALS)
@pytest.mark.parametrize("stream", [False, True])
def test_refusals_store_nothing(
    gw: Gateway, items: list[dict[str, Any]], code: str, param: str, message: str, stream: bool
) -> None:
    gw.script(text("never"))
    r = gw.post({"model": "test-model", "input": items, "tools": [PATCH, LOCAL_SHELL], "stream": stream})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["message"] == message and error["param"] == param
    assert error["code"] == (None if code == "invalid_request_error" else code)
    assert gw.upstream_bodies() == []
    assert Response.objects.count() == 0


def test_websocket_round_trip_of_both_tools(
    live_gateway: LiveServer, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    gateway_config(llm_api_base=upstream.url, upstream_api="responses")
    upstream.script(
        "/v1/responses",
        handler(
            Script(
                [
                    call(
                        "apply_patch", '{"type": "create_file", "path": "a", "diff": "+a"}', call_id="call_p"
                    ),
                    call("local_shell", '{"command": ["cat", "a"]}', call_id="call_l"),
                ]
            )
        ),
    )
    upstream.script("/v1/responses", handler(Script([text("done")])))

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with await connect(live_gateway.url) as ws:
            c = Client(ws)
            await c.send(
                create(store=False, input="go", tools=[PATCH, LOCAL_SHELL], parallel_tool_calls=True)
            )
            first = await c.until_terminal()
            outputs = [
                {"type": "apply_patch_call_output", "call_id": "call_p", "status": "completed"},
                {"type": "local_shell_call_output", "call_id": "call_l", "output": "a"},
            ]
            rid = first[-1]["response"]["id"]
            await c.send(
                create(store=False, previous_response_id=rid, input=outputs, tools=[PATCH, LOCAL_SHELL])
            )
            second = await c.until_terminal()
        return first, second

    first, second = asyncio.run(scenario())
    assert first[-1]["type"] == "response.completed", first[-1]
    assert [i["type"] for i in first[-1]["response"]["output"]] == ["apply_patch_call", "local_shell_call"]
    for event in first:
        check_sdk_event(event)
    assert second[-1]["type"] == "response.completed", second[-1]
    sent = [r.json() for r in upstream.requests if r.path == "/v1/responses"][-1]["input"]
    assert [(i["type"], i.get("name")) for i in sent[1:]] == [
        ("function_call", "apply_patch"),
        ("function_call", "local_shell"),
        ("function_call_output", None),
        ("function_call_output", None),
    ]
