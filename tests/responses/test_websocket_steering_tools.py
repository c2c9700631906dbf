"""WebSocket steering during gateway tool work, and over the chat-completions wire.

Spec: the steering paragraphs under "WS /v1/responses" in gateway-api.txt (issue 24).
"""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web

from tests.responses.scripts import Script, call, chat_chunks, text
from tests.responses.test_websocket_steering import TERMINAL, recv_until, run, steer
from tests.responses.wsutil import Client, connect, create
from tests.upstream import Gate, Recorded


@pytest.mark.parametrize("wire", ["responses"], indirect=True)
def test_steering_during_gateway_tool_work_and_fresh_budgets(tools_gw: Any) -> None:
    gw = tools_gw
    assert gw.provider is not None
    gw.provider.slow_delay_s = 1.0
    gw.script(call("web_search", '{"queries": ["slow weather"]}', call_id="call_s1"))
    gw.script(call("web_search", '{"queries": ["more weather"]}', call_id="call_s2"))
    gw.script(text("Done in Fahrenheit."))
    body = {"tools": [{"type": "web_search"}], "max_tool_calls": 1, "store": False}

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="g", input="weather?", **body))
            events = await recv_until(c, "response.output_item.added")
            await c.send(steer(events[0]["response"]["id"]))
            events += await recv_until(c, "response.incomplete")
            events += await c.until_terminal()
            return events

    events = run(scenario())
    parent = next(e for e in events if e["type"] == "response.incomplete")["response"]
    assert parent["incomplete_details"] == {"reason": "steered"}
    # The started search finished; no further model round ran for the parent.
    assert [(i["type"], i["status"]) for i in parent["output"]] == [("web_search_call", "completed")]
    successor = events[-1]["response"]
    assert successor["status"] == "completed" and successor["previous_response_id"] == parent["id"]
    # Fresh budgets: the successor's own search ran although the parent used max_tool_calls = 1.
    assert [(i["type"], i["status"]) for i in successor["output"]] == [
        ("web_search_call", "completed"),
        ("message", "completed"),
    ]
    assert [r.query["q"] for r in gw.provider.requests] == ["slow weather", "more weather"]
    assert len(gw.upstream_bodies()) == 3


@pytest.mark.parametrize("wire", ["chat_completions"], indirect=True)
def test_chat_completions_rounds_have_no_item_boundaries_so_the_round_completes(
    tools_gw: Any,
) -> None:
    """Over chat completions the upstream has no item lifecycle events: a steer mid-round cannot
    stop the round early; the parent completes naturally and the successor follows."""
    gw = tools_gw
    gate = Gate()

    async def answer(request: web.Request, rec: Recorded) -> web.StreamResponse:
        chunks = chat_chunks(Script([text("one ", "two ", "three")]), rec.json())
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for index, payload in enumerate(chunks):
            if index == 3:
                await gate.wait()
            await response.write(b"data: " + payload + b"\n\n")
        await response.write_eof()
        return response

    gw.upstream.script("/v1/chat/completions", answer)
    gw.script(text("successor"))

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(store=False))
            events = await recv_until(c, "response.output_text.delta")
            await c.send(steer(events[0]["response"]["id"]))
            events += await recv_until(c, "response.steer.accepted")
            gate.open()
            events += await c.until_terminal(2)
            return events

    events = run(scenario())
    terminals = [e for e in events if e["type"] in TERMINAL]
    assert [e["type"] for e in terminals] == ["response.completed", "response.completed"]
    assert terminals[0]["response"]["output"][0]["content"][0]["text"] == "one two three"


@pytest.mark.parametrize("wire", ["responses"], indirect=True)
def test_a_parent_waiting_for_an_mcp_approval_refuses_steering(tools_gw: Any, mcp_server: Any) -> None:
    """An approval request is client-owned input steering cannot describe: the accepted steering
    comes back with ``steering_not_supported`` after the parent's terminal event."""
    gw = tools_gw
    _, _, url = mcp_server
    decl = {"type": "mcp", "server_label": "local", "server_url": url, "require_approval": "always"}
    gw.script(call("mcp__local__tool_0", '{"text": "please"}', call_id="call_a"))

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(store=False, tools=[decl]))
            events = await c.until_terminal()
            rid = events[0]["response"]["id"]
            await c.send(steer(rid))  # the completed parent is no longer eligible
            events.append(await c.recv())
            return events

    events = run(scenario())
    assert [i["type"] for i in events[-2]["response"]["output"]] == ["mcp_list_tools", "mcp_approval_request"]
    failed = events[-1]
    assert failed["type"] == "response.steer.failed"
    assert (
        failed["error"]["code"] == "steering_not_supported"
        and "mcp_approval_request" in failed["error"]["message"]
    )
    assert len(gw.upstream_bodies()) == 1
