"""``max_tool_calls`` in the tool loop, as the spec's section says (and OpenAI's recordings show):
dispatched built-in calls count across rounds (failed ones too; listings and client calls do not),
a call over the limit is not run and the model gets the limit error, later rounds offer no gateway
tools, exactly one refused web_search_call / code_interpreter_call stays (at searching /
interpreting, no completed event), refused MCP calls are omitted; echoed, not inherited, not
forwarded."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.responses.scripts import call, text
from tests.responses.tool_fixtures import ToolsGateway, args, model_input, offered_tools, types_of

WS = {"type": "web_search"}
CODE = {"type": "code_interpreter", "container": {"type": "auto"}}
LIMIT_1 = '{"error":"UserError: Reached tool call limit of 1"}'


def outputs_seen(gw: ToolsGateway, request: int) -> dict[str, str]:
    return {s["output"][0]: s["output"][1] for s in model_input(gw, request) if "output" in s}


def test_limit_one_with_two_calls_in_one_round(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    gw.script(
        call("web_search", args(queries=["potato"]), call_id="call_1"),
        call("web_search", args(queries=["tomato"]), call_id="call_2"),
    )
    gw.script(text("Only potato."))
    events = gw.events({"model": "m", "input": "x", "tools": [WS], "max_tool_calls": 1})
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert [(i["type"], i["status"], i["action"]["query"]) for i in final["output"][:2]] == [
        ("web_search_call", "completed", "potato"),
        ("web_search_call", "searching", "tomato"),
    ]
    refused_id = final["output"][1]["id"]
    refused_events = [
        e["type"]
        for e in events
        if e.get("item_id") == refused_id or e.get("item", {}).get("id") == refused_id
    ]
    assert refused_events == [
        "response.output_item.added",
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.output_item.done",
    ]
    assert types_of(events).count("response.web_search_call.completed") == 1
    # The refused call was not run; the model got the limit error and no gateway tools afterwards.
    assert gw.provider is not None and [r.query["q"] for r in gw.provider.requests] == ["potato"]
    seen = outputs_seen(gw, 1)
    assert seen["call_2"] == LIMIT_1
    assert "potato result 1" in seen["call_1"]
    assert offered_tools(gw, 0) == ["web_search"]
    assert offered_tools(gw, 1) == []
    # Echoed everywhere, never forwarded upstream.
    assert events[0]["response"]["max_tool_calls"] == 1 and final["max_tool_calls"] == 1
    assert httpx.get(f"{gw.url}/v1/responses/{final['id']}").json()["max_tool_calls"] == 1
    assert all("max_tool_calls" not in body for body in gw.upstream_bodies())


def test_the_limit_counts_across_rounds(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    for query in ("one", "two", "three"):
        gw.script(call("web_search", args(queries=[query]), call_id=f"call_{query}"))
    gw.script(text("done"))
    final = gw.create({"model": "m", "input": "x", "tools": [WS], "max_tool_calls": 2})
    assert [(i["action"]["query"], i["status"]) for i in final["output"][:3]] == [
        ("one", "completed"),
        ("two", "completed"),
        ("three", "searching"),
    ]
    assert final["output"][3]["type"] == "message"
    assert [offered_tools(gw, n) for n in range(4)] == [["web_search"], ["web_search"], ["web_search"], []]
    assert outputs_seen(gw, 3)["call_three"] == '{"error":"UserError: Reached tool call limit of 2"}'


def test_exactly_one_refused_item_stays(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    gw.script(*(call("web_search", args(queries=[f"q{n}"]), call_id=f"call_{n}") for n in range(4)))
    gw.script(text("done"))
    final = gw.create({"model": "m", "input": "x", "tools": [WS], "max_tool_calls": 1})
    assert [(i["type"], i.get("status")) for i in final["output"]] == [
        ("web_search_call", "completed"),
        ("web_search_call", "searching"),
        ("message", "completed"),
    ]
    seen = outputs_seen(gw, 1)
    assert [seen[f"call_{n}"] for n in (1, 2, 3)] == [LIMIT_1] * 3
    # The omitted calls still reach the model in call order.
    calls = [s["call"][2] for s in model_input(gw, 1) if "call" in s]
    assert calls == ["call_0", "call_1", "call_2", "call_3"]


def test_a_refused_code_interpreter_call_stays_at_interpreting(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    gw.script(
        call("code_interpreter", args(code="print(1)"), call_id="call_a"),
        call("code_interpreter", args(code="print(2)"), call_id="call_b"),
    )
    gw.script(text("done"))
    events = gw.events({"model": "m", "input": "x", "tools": [CODE], "max_tool_calls": 1})
    final = events[-1]["response"]
    assert [(i["status"], i["code"]) for i in final["output"][:2]] == [
        ("completed", "print(1)"),
        ("interpreting", "print(2)"),
    ]
    refused_id = final["output"][1]["id"]
    refused_events = [
        e["type"]
        for e in events
        if e.get("item_id") == refused_id or e.get("item", {}).get("id") == refused_id
    ]
    assert refused_events == [
        "response.output_item.added",
        "response.code_interpreter_call.in_progress",
        "response.code_interpreter_call_code.delta",
        "response.code_interpreter_call_code.done",
        "response.code_interpreter_call.interpreting",
        "response.output_item.done",
    ]
    assert types_of(events).count("response.code_interpreter_call.completed") == 1
    assert outputs_seen(gw, 1)["call_b"] == LIMIT_1


def test_refused_mcp_calls_are_omitted_and_listing_does_not_count(
    tools_gw: ToolsGateway, mcp_server: Any
) -> None:
    gw = tools_gw
    _, record, url = mcp_server
    mcp = {"type": "mcp", "server_label": "local", "server_url": url, "require_approval": "never"}
    gw.script(
        call("mcp__local__tool_0", args(text="a"), call_id="call_m1"),
        call("mcp__local__tool_1", args(text="b"), call_id="call_m2"),
        call("web_search", args(queries=["later"]), call_id="call_w"),
    )
    gw.script(text("done"))
    final = gw.create({"model": "m", "input": "x", "tools": [mcp, WS], "max_tool_calls": 1})
    assert [(i["type"], i.get("status")) for i in final["output"]] == [
        ("mcp_list_tools", None),
        ("mcp_call", "completed"),  # the listing did not use up the limit
        ("web_search_call", "searching"),  # the first refused kept kind; the refused MCP call is omitted
        ("message", "completed"),
    ]
    assert record.calls == [("tool_0", {"text": "a"})]
    seen = outputs_seen(gw, 1)
    assert seen["call_m2"] == seen["call_w"] == LIMIT_1


def test_client_calls_do_not_count(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    fn = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    gw.script(
        call("get_weather", args(city="Paris"), call_id="call_c"),
        call("web_search", args(queries=["paris"]), call_id="call_w"),
    )
    final = gw.create({"model": "m", "input": "x", "tools": [fn, WS], "max_tool_calls": 1})
    assert [(i["type"], i["status"]) for i in final["output"]] == [
        ("function_call", "completed"),
        ("web_search_call", "completed"),
    ]


def test_a_failed_call_counts(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    assert gw.provider is not None
    gw.provider.error = (500, {"error": "down"})
    gw.script(call("web_search", args(queries=["a"]), call_id="call_a"))
    gw.script(call("web_search", args(queries=["b"]), call_id="call_b"))
    gw.script(text("done"))
    final = gw.create({"model": "m", "input": "x", "tools": [WS], "max_tool_calls": 1})
    assert [i.get("status") for i in final["output"]] == ["failed", "searching", "completed"]
    assert len(gw.provider.requests) == 1
    assert outputs_seen(gw, 2)["call_b"] == LIMIT_1


def test_the_limit_is_not_inherited(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    gw.script(text("first"))
    first = gw.create({"model": "m", "input": "x", "tools": [WS], "max_tool_calls": 1})
    assert first["max_tool_calls"] == 1
    gw.script(call("web_search", args(queries=["a"])), call("web_search", args(queries=["b"])))
    gw.script(text("second"))
    second = gw.create({"model": "m", "input": "y", "tools": [WS], "previous_response_id": first["id"]})
    assert second["max_tool_calls"] is None
    assert [i.get("status") for i in second["output"]] == ["completed", "completed", "completed"]
    assert all("max_tool_calls" not in body for body in gw.upstream_bodies())


@pytest.mark.parametrize(
    ("value", "code", "message"),
    [
        (
            0,
            "integer_below_min_value",
            "Invalid 'max_tool_calls': integer below minimum value. Expected a value >= 1, but got 0 instead.",
        ),
        (
            9223372036854775808,
            "integer_above_max_value",
            "Invalid 'max_tool_calls': integer above maximum value. Expected a value <= 9223372036854775807, "
            "but got 9223372036854775808 instead.",
        ),
        (
            3.0,
            "invalid_type",
            "Invalid type for 'max_tool_calls': expected an integer, but got a decimal number instead.",
        ),
        (
            True,
            "invalid_type",
            "Invalid type for 'max_tool_calls': expected an integer, but got a boolean instead.",
        ),
    ],
)
def test_invalid_values_on_a_tool_request(
    tools_gw: ToolsGateway, value: Any, code: str, message: str
) -> None:
    gw = tools_gw
    r = gw.post({"model": "m", "input": "x", "tools": [WS], "max_tool_calls": value, "stream": True})
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": message,
        "type": "invalid_request_error",
        "param": "max_tool_calls",
        "code": code,
    }
    assert gw.upstream_bodies() == []


def test_the_largest_value_is_accepted(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    gw.script(text("ok"))
    final = gw.create({"model": "m", "input": "x", "tools": [WS], "max_tool_calls": 9223372036854775807})
    assert final["max_tool_calls"] == 9223372036854775807


def test_approved_mcp_calls_count_against_the_limit(tools_gw: ToolsGateway, mcp_server: Any) -> None:
    """``mcp_approval_response`` continuations run approved calls under the continuation's limit."""
    gw = tools_gw
    _, record, url = mcp_server
    mcp = {"type": "mcp", "server_label": "local", "server_url": url, "require_approval": "always"}
    gw.script(
        call("mcp__local__tool_0", args(text="a"), call_id="call_m1"),
        call("mcp__local__tool_1", args(text="b"), call_id="call_m2"),
    )
    first = gw.create({"model": "m", "input": "x", "tools": [mcp]})
    requests = [i for i in first["output"] if i["type"] == "mcp_approval_request"]
    assert [r["name"] for r in requests] == ["tool_0", "tool_1"]
    assert record.calls == []

    gw.script(text("Only one ran."))
    approvals = [
        {"type": "mcp_approval_response", "approval_request_id": r["id"], "approve": True} for r in requests
    ]
    final = gw.create(
        {
            "model": "m",
            "previous_response_id": first["id"],
            "input": approvals,
            "tools": [mcp],
            "max_tool_calls": 1,
        }
    )
    assert final["status"] == "completed"
    # The second approved call is over the limit: not run, its item omitted, the model told why.
    assert [(i["type"], i.get("status")) for i in final["output"]] == [
        ("mcp_call", "completed"),
        ("message", "completed"),
    ]
    assert final["output"][0]["approval_request_id"] == requests[0]["id"]
    assert record.calls == [("tool_0", {"text": "a"})]
    seen = outputs_seen(gw, 1)
    assert seen[requests[0]["id"]] == "tool_0 got a"
    assert seen[requests[1]["id"]] == LIMIT_1
    assert offered_tools(gw, 1) == []  # the limit is spent: no gateway tools for the model
