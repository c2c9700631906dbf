"""MCP through the Responses API: discovery items, calls, failures, approvals, credentials, limits.

A real MCP server built with the ``mcp`` SDK runs on loopback (tools ``tool_0`` … ``tool_2``; a
call echoes ``<tool> got <text>``, ``mode: fail`` makes the tool report an error).
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from conversations_app.models import Item
from responses_app.models import Response
from tests.responses.scripts import call, text
from tests.responses.tool_fixtures import ToolsGateway, args, model_input, offered_tools, types_of
from tests.servers import free_port

SECRET = "secret-token-123"


def mcp_decl(url: str, **extra: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "local", "server_url": url, "require_approval": "never", **extra}


def no_secret_anywhere(value: Any) -> None:
    assert SECRET not in orjson.dumps(value).decode()
    assert "X-Team" not in orjson.dumps(value).decode()


def test_mcp_listing_and_call_with_events_and_stripped_credentials(
    tools_gw: ToolsGateway, mcp_server: Any
) -> None:
    gw = tools_gw
    _, record, url = mcp_server
    decl = mcp_decl(url, authorization=SECRET, headers={"X-Team": "alpha"})
    gw.script(call("mcp__local__tool_1", '{"text": ', '"hi"}', call_id="call_m"))
    gw.script(text("The tool said hi."))
    events = gw.events({"model": "m", "input": "x", "tools": [decl]})
    assert types_of(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.output_item.done",
        "response.output_item.added",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress",
        "response.mcp_call.completed",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    listing = events[5]["item"]
    assert listing["id"].startswith("mcpl_") and listing["type"] == "mcp_list_tools"
    assert listing["server_label"] == "local" and listing["error"] is None
    assert [t["name"] for t in listing["tools"]] == ["tool_0", "tool_1", "tool_2"]
    assert listing["tools"][0]["input_schema"] == {
        "type": "object",
        "properties": {"text": {"type": "string"}},
    }
    mcp_call = events[11]["item"]
    assert mcp_call == {
        "id": mcp_call["id"],
        "type": "mcp_call",
        "status": "completed",
        "server_label": "local",
        "name": "tool_1",
        "arguments": '{"text": "hi"}',
        "output": "tool_1 got hi",
        "error": None,
        "approval_request_id": None,
    }
    assert events[7]["delta"] == '{"text": "hi"}' and events[8]["arguments"] == '{"text": "hi"}'
    assert record.calls == [("tool_1", {"text": "hi"})]
    # The request's credentials were used on the wire …
    posts = [h for h in record.headers if "authorization" in h]
    assert posts and all(h["authorization"] == f"Bearer {SECRET}" and h["x-team"] == "alpha" for h in posts)
    # … and nowhere else: not echoed, not streamed, not stored, not retrieved, not upstream.
    final = events[-1]["response"]
    assert final["tools"] == [mcp_decl(url)]
    for event in events:
        no_secret_anywhere(event)
    no_secret_anywhere(httpx.get(f"{gw.url}/v1/responses/{final['id']}").json())
    no_secret_anywhere(httpx.get(f"{gw.url}/v1/responses/{final['id']}/input_items").json())
    no_secret_anywhere(Response.objects.get(id=final["id"]).request)
    no_secret_anywhere(Response.objects.get(id=final["id"]).snapshot)
    no_secret_anywhere([i.data for i in Item.objects.all()])
    no_secret_anywhere(gw.upstream_bodies())

    assert offered_tools(gw, 0) == ["mcp__local__tool_0", "mcp__local__tool_1", "mcp__local__tool_2"]
    seen = model_input(gw, 1)
    assert {"call": ("mcp__local__tool_1", '{"text": "hi"}', "call_m")} in seen
    assert {"output": ("call_m", "tool_1 got hi")} in seen


def test_listing_is_emitted_once_per_history(tools_gw: ToolsGateway, mcp_server: Any) -> None:
    gw = tools_gw
    _, record, url = mcp_server
    gw.script(text("first"))
    first = gw.create({"model": "m", "input": "x", "tools": [mcp_decl(url)]})
    assert [i["type"] for i in first["output"]] == ["mcp_list_tools", "message"]
    lists = len(record.cursors)
    gw.script(text("second"))
    second = gw.create(
        {"model": "m", "input": "more", "previous_response_id": first["id"], "tools": [mcp_decl(url)]}
    )
    assert [i["type"] for i in second["output"]] == ["message"]
    assert len(record.cursors) == lists  # no second tools/list: the history's listing is re-offered
    gw.script(call("mcp__local__tool_2", args(text="again")))
    gw.script(text("third"))
    third = gw.create(
        {"model": "m", "input": "more", "previous_response_id": second["id"], "tools": [mcp_decl(url)]}
    )
    assert [i["type"] for i in third["output"]] == ["mcp_call", "message"]
    assert third["output"][0]["output"] == "tool_2 got again"
    assert offered_tools(gw, 1) == ["mcp__local__tool_0", "mcp__local__tool_1", "mcp__local__tool_2"]


def test_a_failing_tool_is_a_failed_mcp_call_fed_back(tools_gw: ToolsGateway, mcp_server: Any) -> None:
    gw = tools_gw
    _, _, url = mcp_server
    gw.script(call("mcp__local__tool_0", args(mode="fail"), call_id="call_bad"))
    gw.script(text("It broke."))
    events = gw.events({"model": "m", "input": "x", "tools": [mcp_decl(url)]})
    assert "response.mcp_call.failed" in types_of(events)
    assert "response.mcp_call.completed" not in types_of(events)
    item = next(
        e["item"]
        for e in events
        if e["type"] == "response.output_item.done" and e["item"]["type"] == "mcp_call"
    )
    assert item["status"] == "failed" and item["output"] is None
    assert item["error"] == {
        "type": "mcp_tool_execution_error",
        "content": [{"type": "text", "text": "the tool broke"}],
    }
    assert {"output": ("call_bad", '{"error":"the tool broke"}')} in model_input(gw, 1)
    assert events[-1]["response"]["status"] == "completed"


def test_an_unreachable_server_gives_a_failed_listing_and_the_response_goes_on(
    tools_gw: ToolsGateway,
) -> None:
    gw = tools_gw
    assert gw.configure is not None
    gw.configure(mcp__discovery_timeout_s=3.0)
    url = f"http://127.0.0.1:{free_port()}/mcp"
    gw.script(text("No tools today."))
    events = gw.events({"model": "m", "input": "x", "tools": [mcp_decl(url)]})
    assert types_of(events)[2:6] == [
        "response.output_item.added",
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.failed",
        "response.output_item.done",
    ]
    listing = events[5]["item"]
    assert listing["tools"] == [] and listing["error"].startswith("could not list tools")
    assert events[-1]["response"]["status"] == "completed"
    assert offered_tools(gw, 0) == []


# --- approvals ----------------------------------------------------------------------------------


def test_approval_then_approve_runs_the_call_in_the_continuation(
    tools_gw: ToolsGateway, mcp_server: Any
) -> None:
    gw = tools_gw
    _, record, url = mcp_server
    decl = mcp_decl(url, require_approval="always", authorization=SECRET)
    gw.script(call("mcp__local__tool_0", args(text="please"), call_id="call_a"))
    events = gw.events({"model": "m", "input": "x", "tools": [decl]})
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert [i["type"] for i in final["output"]] == ["mcp_list_tools", "mcp_approval_request"]
    request = final["output"][1]
    assert request["id"].startswith("mcpr_")
    assert request == {
        "id": request["id"],
        "type": "mcp_approval_request",
        "server_label": "local",
        "name": "tool_0",
        "arguments": args(text="please"),
    }
    assert types_of(events)[6:8] == ["response.output_item.added", "response.output_item.done"]
    assert record.calls == []  # nothing ran
    assert len(gw.upstream_bodies()) == 1

    gw.script(text("Done."))
    events = gw.events(
        {
            "model": "m",
            "previous_response_id": final["id"],
            "input": [
                {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}
            ],
            "tools": [decl],
        }
    )
    second = events[-1]["response"]
    assert [i["type"] for i in second["output"]] == ["mcp_call", "message"]
    assert second["output"][0]["approval_request_id"] == request["id"]
    assert second["output"][0]["output"] == "tool_0 got please"
    assert types_of(events)[2:8] == [
        "response.output_item.added",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress",
        "response.mcp_call.completed",
        "response.output_item.done",
    ]
    assert record.calls == [("tool_0", {"text": "please"})]
    seen = model_input(gw, 1)
    assert {"call": ("mcp__local__tool_0", args(text="please"), request["id"])} in seen
    assert {"output": (request["id"], "tool_0 got please")} in seen


def test_approval_denied_tells_the_model(tools_gw: ToolsGateway, mcp_server: Any) -> None:
    gw = tools_gw
    _, record, url = mcp_server
    decl = mcp_decl(url, require_approval="always")
    gw.script(call("mcp__local__tool_1", args(text="delete everything")))
    first = gw.create({"model": "m", "input": "x", "tools": [decl]})
    request = first["output"][-1]
    gw.script(text("OK, I will not."))
    second = gw.create(
        {
            "model": "m",
            "previous_response_id": first["id"],
            "input": [
                {
                    "type": "mcp_approval_response",
                    "approval_request_id": request["id"],
                    "approve": False,
                    "reason": "too risky",
                }
            ],
            "tools": [decl],
        }
    )
    assert [i["type"] for i in second["output"]] == ["message"]
    assert record.calls == []
    seen = model_input(gw, 1)
    assert {"call": ("mcp__local__tool_1", args(text="delete everything"), request["id"])} in seen
    output = next(s["output"][1] for s in seen if "output" in s)
    assert orjson.loads(output) == {
        "error": "The user denied this tool call; it was not run. Reason: too risky"
    }


def test_approval_is_required_by_default(tools_gw: ToolsGateway, mcp_server: Any) -> None:
    gw = tools_gw
    _, record, url = mcp_server
    decl = {"type": "mcp", "server_label": "local", "server_url": url}  # require_approval omitted
    gw.script(call("mcp__local__tool_0", args(text="x")))
    final = gw.create({"model": "m", "input": "x", "tools": [decl]})
    assert final["output"][-1]["type"] == "mcp_approval_request"
    assert record.calls == []


def test_per_tool_approval_filters(tools_gw: ToolsGateway, mcp_server: Any) -> None:
    gw = tools_gw
    _, record, url = mcp_server
    decl = mcp_decl(url, require_approval={"never": {"tool_names": ["tool_0"]}})
    gw.script(
        call("mcp__local__tool_0", args(text="free"), call_id="call_free"),
        call("mcp__local__tool_1", args(text="gated"), call_id="call_gated"),
    )
    final = gw.create({"model": "m", "input": "x", "tools": [decl]})
    # tool_0 ran in this round (recorded); tool_1 waits for approval, which ends the response.
    assert [i["type"] for i in final["output"]] == ["mcp_list_tools", "mcp_call", "mcp_approval_request"]
    assert final["output"][1]["output"] == "tool_0 got free"
    assert final["output"][2]["name"] == "tool_1"
    assert record.calls == [("tool_0", {"text": "free"})]
    assert len(gw.upstream_bodies()) == 1


def test_an_approval_for_an_unknown_request_is_a_400(tools_gw: ToolsGateway, mcp_server: Any) -> None:
    gw = tools_gw
    _, _, url = mcp_server
    gw.script(text("hi"))
    first = gw.create({"model": "m", "input": "x"})
    before = Response.objects.count()
    r = gw.post(
        {
            "model": "m",
            "previous_response_id": first["id"],
            "input": [{"type": "mcp_approval_response", "approval_request_id": "mcpr_nope", "approve": True}],
            "tools": [mcp_decl(url)],
        }
    )
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "No MCP approval request found with id 'mcpr_nope'.",
        "type": "invalid_request_error",
        "param": "input",
        "code": "invalid_value",
    }
    assert Response.objects.count() == before
    assert len(gw.upstream_bodies()) == 1


def test_an_approved_call_needs_the_server_declared_again(tools_gw: ToolsGateway, mcp_server: Any) -> None:
    gw = tools_gw
    _, record, url = mcp_server
    gw.script(call("mcp__local__tool_0", args(text="x")))
    first = gw.create({"model": "m", "input": "x", "tools": [mcp_decl(url, require_approval="always")]})
    request = first["output"][-1]
    gw.script(text("Could not run it."))
    second = gw.create(
        {
            "model": "m",
            "previous_response_id": first["id"],
            "input": [
                {"type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True}
            ],
        }
    )
    item = second["output"][0]
    assert item["type"] == "mcp_call" and item["status"] == "failed"
    assert item["error"]["type"] == "mcp_protocol_error"
    assert "is not declared in this request" in item["error"]["message"]
    assert record.calls == []


# --- limits ---------------------------------------------------------------------------------------


def _assert_refused(gw: ToolsGateway, r: httpx.Response, *, param: str, code: str) -> dict[str, Any]:
    assert r.status_code == 400, r.text
    error: dict[str, Any] = r.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert Response.objects.count() == 0  # nothing stored
    assert gw.upstream_bodies() == []  # no inference
    return error


def test_more_than_64_mcp_servers_is_a_400(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    tools = [
        {"type": "mcp", "server_label": f"s{n}", "server_url": f"https://mcp{n}.example.com/mcp"}
        for n in range(65)
    ]
    error = _assert_refused(
        gw,
        gw.post({"model": "m", "input": "x", "tools": tools}),
        param="tools",
        code="array_above_max_length",
    )
    assert error["message"] == "Too many MCP servers: 65 declared, at most 64 are allowed."


def test_more_than_max_tools_discovered_is_a_400(tools_gw: ToolsGateway, mcp_server: Any) -> None:
    gw = tools_gw
    assert gw.configure is not None
    gw.configure(mcp__max_tools=2)
    _, _, url = mcp_server
    for stream in (False, True):
        r = gw.post({"model": "m", "input": "x", "tools": [mcp_decl(url)], "stream": stream})
        error = _assert_refused(gw, r, param="tools", code="array_above_max_length")
        assert error["message"].startswith("Too many MCP tools: the declared servers offer 3, at most 2")


def test_a_disallowed_host_is_a_400_before_any_connection(tools_gw: ToolsGateway, mcp_server: Any) -> None:
    gw = tools_gw
    assert gw.configure is not None
    gw.configure(mcp__allowed_hosts=())
    _, record, url = mcp_server
    for stream in (False, True):
        r = gw.post({"model": "m", "input": "x", "tools": [mcp_decl(url)], "stream": stream})
        _assert_refused(gw, r, param="tools[0].server_url", code="invalid_value")
    r = gw.post({"model": "m", "input": "x", "tools": [mcp_decl(url)], "background": True})
    _assert_refused(gw, r, param="tools[0].server_url", code="invalid_value")
    assert record.headers == []


def test_discovery_metadata_counts_against_the_retained_budget(
    tools_gw: ToolsGateway, mcp_server: Any
) -> None:
    gw = tools_gw
    _, _, url = mcp_server
    assert gw.configure is not None
    gw.configure(responses__max_retained_bytes=200)
    gw.script(text("never sent"))
    events = gw.events({"model": "m", "input": "x", "tools": [mcp_decl(url)]})
    final = events[-1]["response"]
    assert final["status"] == "failed"
    assert final["error"] == {
        "code": "server_error",
        "message": "The response exceeded max_retained_bytes (200 bytes) of retained state.",
    }
    assert gw.upstream_bodies() == []
