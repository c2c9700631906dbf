"""Compaction inside a response: ``context_management`` (the threshold just below and just above
the estimate, tool rounds, usage sums, storage and continuation, the cache fields and tier) and
Codex's ``compaction_trigger`` item over HTTP SSE and WebSocket, against the scripted upstream.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import orjson
import pytest

from conversations_app.models import Item
from responses_app.models import Response
from tests.responses.conftest import Gateway, check_sdk_event, check_sdk_response
from tests.responses.scripts import call, text
from tests.responses.tool_fixtures import ToolsGateway, model_input, types_of
from tests.responses.wsutil import Client, connect, create

pytestmark = pytest.mark.django_db(transaction=True)

SUMMARY = "Summary: the user asked about A, B and C."
HISTORY = [
    {"role": "user", "content": "A" * 400},
    {"role": "assistant", "content": "B" * 400},
    {"role": "user", "content": "C" * 40},
]
# The estimate of HISTORY as the model reads it (docs/responses.md): 840 bytes / 4, 4 per item,
# 2 per content part.
ESTIMATE = math.ceil(840 / 4) + 3 * 4 + 3 * 2
MESSAGE_EVENTS = [
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


def managed(threshold: int | None) -> list[dict[str, Any]]:
    entry: dict[str, Any] = {"type": "compaction"}
    if threshold is not None:
        entry["compact_threshold"] = threshold
    return [entry]


def texts(gw: Gateway, request: int) -> list[tuple[str, str]]:
    return [entry["text"] for entry in model_input(gw, request) if "text" in entry]


def test_just_above_the_estimate_nothing_is_compacted(gw: Gateway) -> None:
    gw.script(text("answer"))
    r = gw.post({"model": "m", "input": HISTORY, "context_management": managed(ESTIMATE)})
    assert r.status_code == 200, r.text
    assert [i["type"] for i in r.json()["output"]] == ["message"]
    (body,) = gw.upstream_bodies()
    assert "context_management" not in body  # never sent upstream
    assert len(texts(gw, 0)) == 3


def test_an_entry_without_threshold_is_ignored(gw: Gateway) -> None:
    gw.script(text("answer"))
    r = gw.post({"model": "m", "input": HISTORY, "context_management": managed(None)})
    assert r.status_code == 200, r.text
    assert [i["type"] for i in r.json()["output"]] == ["message"]
    assert len(gw.upstream_bodies()) == 1


def test_just_below_the_estimate_the_history_is_compacted_first(gw: Gateway) -> None:
    gw.script(text(SUMMARY), usage={"input_tokens": 300, "output_tokens": 20, "total_tokens": 320})
    gw.script(text("answer"), usage={"input_tokens": 50, "output_tokens": 5, "total_tokens": 55})
    events = gw.stream({"model": "m", "input": HISTORY, "context_management": managed(ESTIMATE - 1)})
    for event in events:
        check_sdk_event(event)
    assert types_of(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        *MESSAGE_EVENTS,
        "response.completed",
    ]
    item = events[3]["item"]
    assert events[2]["item"] == item and events[2]["output_index"] == 0
    assert (
        item["type"] == "compaction"
        and item["id"].startswith("cmp_")
        and item["encrypted_content"] == SUMMARY
    )
    final = events[-1]["response"]
    check_sdk_response(final)
    assert [i["type"] for i in final["output"]] == ["compaction", "message"]
    # Usage: the summary round plus the answer round.
    assert final["usage"]["input_tokens"] == 350 and final["usage"]["output_tokens"] == 25
    assert final["usage"]["total_tokens"] == 375
    summary_body, round_body = gw.upstream_bodies()
    assert summary_body["stream"] is False and round_body["stream"] is True
    assert texts(gw, 0)[:3] == [("user", "A" * 400), ("assistant", "B" * 400), ("user", "C" * 40)]
    # The answer round ran on the window: the user's messages and the summary.
    assert texts(gw, 1) == [("user", "A" * 400), ("user", "C" * 40), ("assistant", SUMMARY)]

    # Stored with the window as its checkpoint; a continuation starts from it.
    row = Response.objects.get(id=final["id"])
    window = [Item.objects.get(id=i).data for i in row.history_item_ids]
    assert [(i["type"], i.get("role")) for i in window] == [
        ("message", "user"),
        ("message", "user"),
        ("compaction", None),
        ("message", "assistant"),
    ]
    gw.script(text("next"))
    r = gw.post({"model": "m", "previous_response_id": final["id"], "input": "more"})
    assert r.status_code == 200, r.text
    assistant = [("assistant", SUMMARY), ("assistant", "answer")]
    if gw.wire == "chat_completions":  # consecutive assistant items are one chat message
        assistant = [("assistant", SUMMARY + "answer")]
    assert texts(gw, 2) == [("user", "A" * 400), ("user", "C" * 40), *assistant, ("user", "more")]


def test_json_answer_and_forwarded_cache_fields_and_tier(gw: Gateway, gateway_config: Any) -> None:
    gateway_config(responses__prompt_cache_options_supported=True)
    gw.script(text(SUMMARY))
    gw.script(text("answer"))
    fields = {
        "prompt_cache_key": "k-1",
        "prompt_cache_options": {"mode": "implicit"},
        "prompt_cache_retention": "in_memory",
        "service_tier": "flex",
    }
    r = gw.post({"model": "m", "input": HISTORY, "context_management": managed(1), **fields})
    assert r.status_code == 200, r.text
    assert [i["type"] for i in r.json()["output"]] == ["compaction", "message"]
    for body in gw.upstream_bodies():
        for key, value in fields.items():
            assert body[key] == value


def test_a_failed_summary_fails_the_response(gw: Gateway) -> None:
    gw.script(error_status=500)
    events = gw.stream({"model": "m", "input": HISTORY, "context_management": managed(1)})
    assert types_of(events) == ["response.created", "response.in_progress", "response.failed"]
    assert Response.objects.get(id=events[-1]["response"]["id"]).status == "failed"


@pytest.mark.parametrize(
    ("value", "param", "code"),
    [
        ([{"type": "summary", "compact_threshold": 5}], "context_management[0].type", "invalid_value"),
        ([{"compact_threshold": 5}], "context_management[0].type", "missing_required_parameter"),
        (
            [{"type": "compaction", "compact_threshold": "5"}],
            "context_management[0].compact_threshold",
            "invalid_type",
        ),
        (
            [{"type": "compaction", "compact_threshold": 0}],
            "context_management[0].compact_threshold",
            "integer_below_min_value",
        ),
        ([{"type": "compaction", "threshold": 5}], "context_management[0].threshold", "unknown_parameter"),
        ([{"type": "compaction"}, {"type": "compaction"}], "context_management[1]", "invalid_value"),
        ([5], "context_management[0]", "invalid_type"),
    ],
)
def test_invalid_entries_are_400_with_param(gw: Gateway, value: Any, param: str, code: str) -> None:
    r = gw.post({"model": "m", "input": "hi", "context_management": value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == (param, code)
    assert gw.upstream_bodies() == [] and not Response.objects.exists()


def test_trigger_not_last_is_400(gw: Gateway) -> None:
    r = gw.post({"model": "m", "input": [{"type": "compaction_trigger"}, {"role": "user", "content": "x"}]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "input[0]"
    assert gw.upstream_bodies() == []


def test_compaction_trigger_over_sse(gw: Gateway) -> None:
    gw.script(text(SUMMARY), usage={"input_tokens": 30, "output_tokens": 9, "total_tokens": 39})
    events = gw.stream(
        {
            "model": "m",
            "input": [*HISTORY, {"type": "compaction_trigger"}],
            "prompt_cache_key": "codex-session",
            "prompt_cache_retention": "24h",
            "service_tier": "priority",
        }
    )
    assert types_of(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]
    for event in events:
        check_sdk_event(event)
    item = events[3]["item"]
    assert item["type"] == "compaction" and item["encrypted_content"] == SUMMARY
    final = events[-1]["response"]
    assert final["output"] == [item]
    assert final["usage"]["total_tokens"] == 39
    (body,) = gw.upstream_bodies()  # the summary round only
    assert body["stream"] is False
    assert (body["prompt_cache_key"], body["prompt_cache_retention"], body["service_tier"]) == (
        "codex-session",
        "24h",
        "priority",
    )
    assert final["prompt_cache_key"] is None  # request-scoped, not echoed
    assert "compaction_trigger" not in orjson.dumps(body).decode()
    row = Response.objects.get(id=final["id"])
    window = [Item.objects.get(id=i).data for i in row.history_item_ids]
    assert [(i["type"], i.get("role")) for i in window] == [
        ("message", "user"),
        ("message", "user"),
        ("compaction", None),
    ]
    users = [i["id"] for i in window[:2]]
    assert Item.objects.filter(id__in=users).count() == 2  # stored once, referenced by the window


def test_a_trigger_response_returns_the_summary_rounds_tier(gw: Gateway) -> None:
    """The summary is the trigger response's one (terminal) inference round: the tier the upstream
    reports for it is returned and stored (spec: service_tier)."""
    gw.script(text(SUMMARY), service_tier="flex")
    events = gw.stream(
        {"model": "m", "input": [*HISTORY, {"type": "compaction_trigger"}], "service_tier": "priority"}
    )
    final = events[-1]["response"]
    assert final["service_tier"] == "flex"
    assert Response.objects.get(id=final["id"]).snapshot["service_tier"] == "flex"
    gw.script(text(SUMMARY), service_tier="default")
    r = gw.post({"model": "m", "input": [*HISTORY, {"type": "compaction_trigger"}]})
    assert r.status_code == 200, r.text
    assert r.json()["service_tier"] == "default"


def test_a_trigger_response_with_mcp_tools_is_its_one_compaction_item(
    tools_gw: ToolsGateway, mcp_server: Any
) -> None:
    """No mcp_list_tools before the compaction item: the response is that item alone."""
    gw = tools_gw
    _, _, url = mcp_server
    decl = {"type": "mcp", "server_label": "local", "server_url": url, "require_approval": "never"}
    gw.script(text(SUMMARY))
    events = gw.events({"model": "m", "input": [*HISTORY, {"type": "compaction_trigger"}], "tools": [decl]})
    assert types_of(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]
    assert [i["type"] for i in events[-1]["response"]["output"]] == ["compaction"]
    # The next response lists the server again (the window holds no listing) and can call it.
    gw.script(text("ok"))
    final = gw.create(
        {"model": "m", "previous_response_id": events[-1]["response"]["id"], "input": "go", "tools": [decl]}
    )
    assert [i["type"] for i in final["output"]] == ["mcp_list_tools", "message"]


def test_compaction_before_a_tool_round(tools_gw: ToolsGateway) -> None:
    """The check runs before every round: after a web search the history is over the threshold."""
    gw = tools_gw
    gw.script(call("web_search", '{"queries": ["lisbon hotels"]}', call_id="call_ws1"))
    gw.script(text(SUMMARY))
    gw.script(text("Here are hotels."))
    body = {
        "model": "m",
        "input": HISTORY,
        "tools": [{"type": "web_search"}],
        "context_management": managed(ESTIMATE + 40),
    }
    final = gw.create(body)
    assert [i["type"] for i in final["output"]] == ["web_search_call", "compaction", "message"]
    bodies = gw.upstream_bodies()
    # A JSON client: every round, the summary's included, asks the upstream for one answer.
    assert [b["stream"] for b in bodies] == [False, False, False]
    # The summary saw the search; the round after it saw the window only.
    assert any("call" in entry for entry in model_input(gw, 1))
    assert [e for e in model_input(gw, 2) if "call" in e or "output" in e] == []


def test_ws_trigger_and_automatic_compaction_keep_the_window_in_the_lane(gw: Gateway) -> None:
    if gw.wire != "responses":
        pytest.skip("the WebSocket transport is wire-independent; one wire is enough")
    gw.script(text("first"))
    gw.script(text(SUMMARY))
    gw.script(text("after trigger"))
    gw.script(text("Second summary."))
    gw.script(text("after auto"))

    async def scenario() -> list[list[dict[str, Any]]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(store=False, input=HISTORY))
            first = await c.until_terminal()
            rid = first[-1]["response"]["id"]
            await c.send(
                create(store=False, previous_response_id=rid, input=[{"type": "compaction_trigger"}])
            )
            trigger = await c.until_terminal()
            rid = trigger[-1]["response"]["id"]
            await c.send(create(store=False, previous_response_id=rid, input="go on"))
            after = await c.until_terminal()
            rid = after[-1]["response"]["id"]
            await c.send(
                create(store=False, previous_response_id=rid, input="again", context_management=managed(1))
            )
            auto = await c.until_terminal()
            return [first, trigger, after, auto]

    _first, trigger, _after, auto = asyncio.run(scenario())
    assert types_of(trigger) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]
    assert trigger[3]["item"]["type"] == "compaction"
    # The continuation of the trigger response ran on the window held by the lane.
    assert texts(gw, 2) == [
        ("user", "A" * 400),
        ("user", "C" * 40),
        ("assistant", SUMMARY),
        ("user", "go on"),
    ]
    assert [i["type"] for i in auto[-1]["response"]["output"]] == ["compaction", "message"]
    assert texts(gw, 4) == [
        ("user", "A" * 400),
        ("user", "C" * 40),
        ("user", "go on"),
        ("user", "again"),
        ("assistant", "Second summary."),
    ]
    assert not Response.objects.exists()  # store: false throughout
