"""The executor's event stream, final object and continuation, in both upstream wire APIs."""

from __future__ import annotations

import orjson
import pytest

from conversations_app.models import Item
from responses_app.models import Response
from tests.responses.conftest import Gateway, check_sdk_event, check_sdk_response
from tests.responses.scripts import call, reasoning, text

EXPECTED_TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.reasoning_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def test_stream_event_order_indices_and_sdk_types(gw: Gateway) -> None:
    gw.script(reasoning("Let me ", "think."), text("Hello", " world"))
    events = gw.stream({"model": "test-model", "input": "Hi"})
    assert [e["type"] for e in events] == EXPECTED_TEXT_EVENTS
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        check_sdk_event(event)
    rs_id = events[2]["item"]["id"]
    msg_id = events[9]["item"]["id"]
    assert rs_id.startswith("rs_") and msg_id.startswith("msg_")
    assert {e.get("output_index") for e in events[2:9]} == {0}
    assert {e.get("output_index") for e in events[9:16]} == {1}
    assert all(e["item_id"] == msg_id and e["content_index"] == 0 for e in events[10:15])
    assert events[13]["text"] == "Hello world"
    assert events[6]["text"] == "Let me think."
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert final["id"].startswith("resp_")
    assert events[0]["response"]["status"] == "in_progress"
    assert [item["type"] for item in final["output"]] == ["reasoning", "message"]
    assert final["output"][1] == {
        "id": msg_id,
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Hello world", "annotations": [], "logprobs": []}],
    }
    assert final["max_tool_calls"] is None
    assert final["usage"]["input_tokens"] == 12
    assert final["usage"]["total_tokens"] == 19
    sdk = check_sdk_response(final)
    assert sdk.output_text == "Hello world"
    # The upstream is asked to stream and to store nothing: the gateway owns state.
    body = gw.upstream_bodies()[-1]
    assert body["stream"] is True
    if gw.wire == "responses":
        assert body["store"] is False
    else:
        assert body["stream_options"] == {"include_usage": True}


def test_sdk_stream_and_retrieve_match(gw: Gateway) -> None:
    gw.script(text("Hi", " there"))
    with gw.client.responses.create(model="test-model", input="Hello", stream=True) as stream:
        events = list(stream)
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    final = events[-1].response
    stored = gw.client.responses.retrieve(final.id)
    assert stored.model_dump() == final.model_dump()
    assert stored.output_text == "Hi there"


def test_non_streaming_returns_the_final_object(gw: Gateway) -> None:
    gw.script(text("Just", " JSON"))
    r = gw.post({"model": "test-model", "input": "Hi", "metadata": {"k": "v"}})
    assert r.status_code == 200
    body = r.json()
    check_sdk_response(body)
    assert body["status"] == "completed"
    assert body["metadata"] == {"k": "v"}
    assert body["output"][0]["content"][0]["text"] == "Just JSON"
    row = Response.objects.get(id=body["id"])
    assert row.snapshot == body
    assert row.status == "completed"
    assert row.input_item_count == 1
    assert len(row.history_item_ids) == 2
    assert Item.objects.filter(id__in=row.history_item_ids).count() == 2


def test_three_turn_chain_sends_whole_history(gw: Gateway) -> None:
    client = gw.client
    gw.script(text("One"))
    first = client.responses.create(model="test-model", input="turn 1", instructions="Be brief.")
    gw.script(text("Two"))
    second = client.responses.create(model="test-model", input="turn 2", previous_response_id=first.id)
    gw.script(text("Three"))
    third = client.responses.create(model="test-model", input="turn 3", previous_response_id=second.id)
    assert third.output_text == "Three"
    assert third.previous_response_id == second.id
    bodies = gw.upstream_bodies()
    last = bodies[-1]
    if gw.wire == "responses":
        texts = [
            (item.get("role"), item["content"][0]["text"])
            for item in last["input"]
            if item["type"] == "message"
        ]
        assert "instructions" not in last  # not inherited through previous_response_id
        assert bodies[0]["instructions"] == "Be brief."
    else:
        texts = [(m["role"], m["content"]) for m in last["messages"]]
        assert bodies[0]["messages"][0] == {"role": "system", "content": "Be brief."}
    assert texts == [
        ("user", "turn 1"),
        ("assistant", "One"),
        ("user", "turn 2"),
        ("assistant", "Two"),
        ("user", "turn 3"),
    ]
    assert "previous_response_id" not in last
    assert third.instructions is None


def test_function_call_round_trip(gw: Gateway) -> None:
    client = gw.client
    tools = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    gw.script(call("get_weather", '{"city": ', '"Paris"}', call_id="call_abc"))
    events = gw.stream({"model": "test-model", "input": "Weather?", "tools": tools})
    types = [e["type"] for e in events]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    for event in events:
        check_sdk_event(event)
    item = events[-1]["response"]["output"][0]
    assert item["type"] == "function_call"
    assert item["id"].startswith("fc_")
    assert item["call_id"] == "call_abc"
    assert item["name"] == "get_weather"
    assert item["arguments"] == '{"city": "Paris"}'
    first_id = events[-1]["response"]["id"]

    gw.script(text("Sunny in Paris."))
    follow = client.responses.create(
        model="test-model",
        previous_response_id=first_id,
        input=[{"type": "function_call_output", "call_id": "call_abc", "output": '{"temp": 21}'}],
        tools=tools,
    )
    assert follow.output_text == "Sunny in Paris."
    last = gw.upstream_bodies()[-1]
    if gw.wire == "responses":
        kinds = [i["type"] for i in last["input"]]
        assert kinds == ["message", "function_call", "function_call_output"]
        assert last["input"][1]["call_id"] == "call_abc"
        assert last["tools"] == tools
    else:
        msgs = last["messages"]
        assert msgs[1]["tool_calls"] == [
            {
                "id": "call_abc",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ]
        assert msgs[2] == {"role": "tool", "tool_call_id": "call_abc", "content": '{"temp": 21}'}
        assert last["tools"][0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize("terminal", ["response.completed", "response.incomplete"])
def test_incomplete_when_upstream_hits_max_tokens(gw: Gateway, terminal: str) -> None:
    # vLLM says it with a ``response.completed`` event carrying status incomplete; others with
    # ``response.incomplete``: both end the response incomplete.
    gw.script(text("cut"), status="incomplete", incomplete_event=terminal)
    events = gw.stream({"model": "test-model", "input": "Hi", "max_output_tokens": 16})
    assert events[-1]["type"] == "response.incomplete"
    final = events[-1]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    check_sdk_event(events[-1])
    assert Response.objects.get(id=final["id"]).status == "incomplete"


def test_store_false_continuation_is_hydrated_but_not_stored(gw: Gateway) -> None:
    gw.script(text("Stored"))
    first = gw.client.responses.create(model="test-model", input="one")
    gw.script(text("Ephemeral"))
    second = gw.client.responses.create(
        model="test-model", input="two", previous_response_id=first.id, store=False
    )
    assert second.output_text == "Ephemeral"
    assert second.store is False
    last = gw.upstream_bodies()[-1]
    raw = orjson.dumps(last)
    assert b"Stored" in raw  # hydrated from the stored parent
    assert not Response.objects.filter(id=second.id).exists()
    r = gw.post({"model": "test-model", "input": "three", "previous_response_id": second.id})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "previous_response_not_found"
    assert r.json()["error"]["param"] == "previous_response_id"
