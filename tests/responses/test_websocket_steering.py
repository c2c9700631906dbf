"""WebSocket steering (``response.steer``) against a live gateway and the scripted upstream.

Spec: the steering paragraphs under "WS /v1/responses" in gateway-api.txt (issue 24). Wire shapes:
the ``openai`` SDK's ``openai.types.beta`` steer events; every control event is parsed with them.
Mid-generation steering holds the upstream stream at a :class:`Gate` until the steer is accepted,
so the safe boundary it waits for is deterministic.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
import websockets
from aiohttp import web
from openai.types.beta import (
    BetaResponseSteerAcceptedEvent,
    BetaResponseSteerFailedEvent,
    BetaResponseSteerPendingEvent,
)

from responses_app.models import Response
from tests.responses.scripts import Part, Script, call, handler, reasoning, responses_events, text
from tests.responses.wsutil import Client, connect, create
from tests.servers import LiveServer
from tests.upstream import Gate, Recorded

STEER_EVENTS = {
    "response.steer.accepted": BetaResponseSteerAcceptedEvent,
    "response.steer.pending": BetaResponseSteerPendingEvent,
    "response.steer.failed": BetaResponseSteerFailedEvent,
}
TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}
FAHRENHEIT = "Keep the work so far, but use Fahrenheit and summarize briefly."
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture
def gw(live_gateway: LiveServer, upstream: Any, gateway_config: Callable[..., Any]) -> Iterator[Any]:
    gateway_config(llm_api_base=upstream.url, upstream_api="responses")
    yield live_gateway


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def script(upstream: Any, *parts: Part, **options: Any) -> None:
    upstream.script("/v1/responses", handler(Script(list(parts), **options)))


def gated(upstream: Any, gate: Gate, *parts: Part, hold_before: str, nth: int = 1, **options: Any) -> None:
    """Stream ``parts`` as vLLM does, holding the stream before the ``nth`` ``hold_before`` event
    until ``gate`` opens (the test opens it once its steer was accepted)."""
    scripted = Script(list(parts), **options)

    async def answer(request: web.Request, rec: Recorded) -> web.StreamResponse:
        events = responses_events(scripted, rec.json())
        if scripted.mutate is not None:
            scripted.mutate(events)
        seen = 0
        response = web.StreamResponse(headers={"content-type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        for index, (kind, data) in enumerate(events):
            if kind == hold_before:
                seen += 1
                if seen == nth:
                    await gate.wait()
            if scripted.truncate_after is not None and index >= scripted.truncate_after:
                break
            await response.write(b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n")
        await response.write_eof()
        return response

    upstream.script("/v1/responses", answer)


def upstream_bodies(upstream: Any) -> list[dict[str, Any]]:
    return [r.json() for r in upstream.requests if r.path == "/v1/responses"]


def steer(previous_response_id: str, value: Any = FAHRENHEIT, **extra: Any) -> dict[str, Any]:
    return {"type": "response.steer", "previous_response_id": previous_response_id, "input": value, **extra}


def checked(event: dict[str, Any]) -> dict[str, Any]:
    """A steering control event, validated against the SDK type of its ``type``."""
    model = STEER_EVENTS[event["type"]]
    assert set(event) <= set(model.model_fields), set(event) - set(model.model_fields)
    assert model.model_validate(event).type == event["type"]
    return event


async def recv_until(c: Client, kind: str, timeout: float = 15) -> list[dict[str, Any]]:
    got = []
    while True:
        event = await c.recv(timeout)
        got.append(event)
        if event["type"] == kind:
            return got


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def control(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [checked(e) for e in events if e["type"] == kind]


def texts(body: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for item in body["input"]:
        if item.get("type", "message") == "message":
            content = item["content"]
            value = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
            out.append((item["role"], value))
        else:
            out.append((item["type"], item.get("call_id", "")))
    return out


# --- accepting and interrupting ----------------------------------------------------------------


def test_steer_mid_generation_finishes_the_active_item_and_the_successor_commits_the_input(
    gw: LiveServer, upstream: Any
) -> None:
    gate = Gate()
    gated(
        upstream,
        gate,
        text("It is ", "21 degrees ", "Celsius."),
        text("A second message the steer prevents."),
        hold_before="response.output_text.delta",
        nth=2,
    )
    script(upstream, text("About 70 °F."))

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="t", store=False, input="Weather in Paris?"))
            events = await recv_until(c, "response.output_text.delta")
            rid = events[0]["response"]["id"]
            await c.send(steer(rid))
            events += await recv_until(c, "response.steer.accepted")
            gate.open()
            events += await recv_until(c, "response.incomplete")
            events += await recv_until(c, "response.completed")
            await c.nothing_more(0.3)
            return events

    events = run(scenario())
    parent_id = events[0]["response"]["id"]
    [accepted] = control(events, "response.steer.accepted")
    assert accepted["steer"]["previous_response_id"] == parent_id
    assert accepted["steer"]["id"].startswith("steer_") and accepted["stream_id"] == "t"
    incomplete = next(e for e in events if e["type"] == "response.incomplete")
    parent = incomplete["response"]
    assert parent["status"] == "incomplete" and parent["incomplete_details"] == {"reason": "steered"}
    # The active message finished whole; the second one never started.
    assert [i["type"] for i in parent["output"]] == ["message"]
    assert parent["output"][0]["content"][0]["text"] == "It is 21 degrees Celsius."
    assert parent["output"][0]["status"] == "completed"
    # The successor: created on the same lane, continuing the parent with the steering input.
    after = events[events.index(incomplete) + 1 :]
    assert after[0]["type"] == "response.created" and after[0]["stream_id"] == "t"
    successor = after[-1]["response"]
    assert successor["previous_response_id"] == parent_id and successor["status"] == "completed"
    assert successor["id"] != parent_id
    second = upstream_bodies(upstream)[1]
    assert texts(second) == [
        ("user", "Weather in Paris?"),
        ("assistant", "It is 21 degrees Celsius."),
        ("user", FAHRENHEIT),
    ]
    # Sequence numbers: the accepted event continues the parent's numbering.
    parent_events = [e for e in events[: events.index(incomplete) + 1]]
    assert sorted(e["sequence_number"] for e in parent_events) == list(range(len(parent_events)))


def test_multiple_steers_get_distinct_ids_and_apply_in_acceptance_order(
    gw: LiveServer, upstream: Any
) -> None:
    gate = Gate()
    gated(
        upstream,
        gate,
        reasoning("thinking ", "hard"),
        text("never sent"),
        hold_before="response.reasoning_text.delta",
        nth=2,
    )
    script(upstream, text("ok"))
    image = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}
    second_input = [{"role": "user", "content": [{"type": "input_text", "text": "second"}, image]}]

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(store=False, input="go"))
            events = await recv_until(c, "response.reasoning_text.delta")
            rid = events[0]["response"]["id"]
            await c.send(steer(rid, "first"))
            await c.send(steer(rid, second_input))
            await c.send(steer(rid, ""))  # empty text is a valid steering update
            for _ in range(3):
                events += await recv_until(c, "response.steer.accepted")
            gate.open()
            events += await recv_until(c, "response.incomplete")
            events += await recv_until(c, "response.completed")
            return events

    events = run(scenario())
    ids = [e["steer"]["id"] for e in control(events, "response.steer.accepted")]
    assert len(set(ids)) == 3
    assert all("stream_id" not in e for e in events)  # the default lane
    parent = next(e for e in events if e["type"] == "response.incomplete")["response"]
    assert [i["type"] for i in parent["output"]] == ["reasoning"]
    body = upstream_bodies(upstream)[1]
    users = [i for i in body["input"] if i.get("role") == "user"]
    assert [u["content"] if isinstance(u["content"], str) else u["content"][0]["text"] for u in users] == [
        "go",
        "first",
        "second",
        "",
    ]
    assert users[2]["content"][1]["type"] == "input_image"


def test_natural_completion_wins_the_race_and_a_successor_follows(gw: LiveServer, upstream: Any) -> None:
    gate = Gate()
    gated(upstream, gate, text("All done."), hold_before="response.completed")
    script(upstream, text("Adjusted."))

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="s", store=False, instructions="Be exact.", temperature=0.3))
            events = await recv_until(c, "response.output_item.done")
            await c.send(steer(events[0]["response"]["id"]))
            events += await recv_until(c, "response.steer.accepted")
            gate.open()
            events += await c.until_terminal(2)
            return events

    events = run(scenario())
    terminals = [e for e in events if e["type"] in TERMINAL]
    assert [e["type"] for e in terminals] == ["response.completed", "response.completed"]
    parent, successor = terminals[0]["response"], terminals[1]["response"]
    assert parent["incomplete_details"] is None and parent["output"][0]["content"][0]["text"] == "All done."
    assert successor["previous_response_id"] == parent["id"]
    # The automatic successor inherits the parent's settings.
    assert successor["instructions"] == "Be exact." and successor["temperature"] == 0.3
    body = upstream_bodies(upstream)[1]
    assert body["instructions"] == "Be exact." and body["temperature"] == 0.3
    assert texts(body)[-1] == ("user", FAHRENHEIT)


def test_an_eligible_completed_parent_accepts_steering(gw: LiveServer, upstream: Any) -> None:
    script(upstream, text("Done."))
    script(upstream, text("Redone."))

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="s", store=False, metadata={"k": "v"}))
            events = await c.until_terminal()
            await c.send(steer(events[0]["response"]["id"]))
            events += await recv_until(c, "response.steer.accepted")
            events += await c.until_terminal()
            return events

    events = run(scenario())
    parent = events[0]["response"]
    successor = events[-1]["response"]
    assert successor["previous_response_id"] == parent["id"] and successor["metadata"] == {"k": "v"}
    created = [e for e in events if e["type"] == "response.created"]
    assert len(created) == 2 and created[1]["stream_id"] == "s"


def test_store_true_stores_the_steered_parent_and_the_successor_with_the_input_once(
    gw: LiveServer, upstream: Any
) -> None:
    gate = Gate()
    gated(
        upstream,
        gate,
        text("Twenty ", "one."),
        text("unsent"),
        hold_before="response.output_text.delta",
        nth=2,
    )
    script(upstream, text("Seventy."))

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(store=True, input="Temperature?"))
            events = await recv_until(c, "response.output_text.delta")
            await c.send(steer(events[0]["response"]["id"]))
            events += await recv_until(c, "response.steer.accepted")
            gate.open()
            events += await c.until_terminal(2)
            return events

    events = run(scenario())
    terminals = [e for e in events if e["type"] in TERMINAL]
    parent_id, successor_id = terminals[0]["response"]["id"], terminals[1]["response"]["id"]
    parent = Response.objects.get(id=parent_id)
    assert parent.status == "incomplete"
    assert parent.snapshot["incomplete_details"] == {"reason": "steered"}
    successor = Response.objects.get(id=successor_id)
    assert successor.status == "completed" and successor.previous_response_id == parent_id
    got = httpx.get(f"{gw.url}/v1/responses/{parent_id}").json()
    assert got["status"] == "incomplete" and got["incomplete_details"] == {"reason": "steered"}
    items = httpx.get(f"{gw.url}/v1/responses/{successor_id}/input_items", params={"order": "asc"}).json()[
        "data"
    ]
    steering_texts = [i for i in items if i.get("role") == "user" and _text(i) == FAHRENHEIT]
    assert len(steering_texts) == 1
    assert [_text(i) for i in items if i.get("role") == "user"] == ["Temperature?", FAHRENHEIT]
    # HTTP continues to support ordinary continuation of the steered parent.
    script(upstream, text("over HTTP"))
    r = httpx.post(
        f"{gw.url}/v1/responses",
        json={"model": "test-model", "input": "and now?", "previous_response_id": parent_id},
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["status"] == "completed"


def _text(item: dict[str, Any]) -> str:
    content = item["content"]
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


# --- client-owned calls: response.steer.pending ------------------------------------------------


def test_pending_steering_waits_for_client_outputs_and_is_prepended_to_the_explicit_create(
    gw: LiveServer, upstream: Any
) -> None:
    gate = Gate()
    gated(
        upstream,
        gate,
        call("get_weather", '{"city": ', '"Paris"}', call_id="call_w1"),
        text("unsent"),
        hold_before="response.function_call_arguments.delta",
        nth=2,
    )
    script(upstream, text("72 °F."))
    tools = [WEATHER_TOOL]

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="p", store=False, tools=tools, instructions="parent rules"))
            events = await recv_until(c, "response.function_call_arguments.delta")
            rid = events[0]["response"]["id"]
            await c.send(steer(rid))
            events += await recv_until(c, "response.steer.accepted")
            gate.open()
            events += await recv_until(c, "response.incomplete")
            events += await recv_until(c, "response.steer.pending")
            output = {"type": "function_call_output", "call_id": "call_w1", "output": "21C"}
            # Missing the required output: refused, the steering stays pending.
            await c.send(
                create(stream_id="p", store=False, previous_response_id=rid, input="hi", tools=tools)
            )
            events += [await c.recv()]
            # Normal output validation still applies (an unknown call id): the steering stays.
            stray = {"type": "function_call_output", "call_id": "call_nope", "output": "x"}
            await c.send(
                create(
                    stream_id="p", store=False, previous_response_id=rid, input=[output, stray], tools=tools
                )
            )
            events += [await c.recv()]
            await c.send(
                create(
                    stream_id="p",
                    store=False,
                    previous_response_id=rid,
                    input=[output],
                    tools=tools,
                    instructions="own rules",
                )
            )
            events += await c.until_terminal()
            await c.nothing_more(0.3)
            return events

    events = run(scenario())
    parent = next(e for e in events if e["type"] == "response.incomplete")["response"]
    assert parent["incomplete_details"] == {"reason": "steered"}
    assert [i["type"] for i in parent["output"]] == ["function_call"]
    [accepted] = control(events, "response.steer.accepted")
    [pending] = control(events, "response.steer.pending")
    assert events.index(pending) > events.index(next(e for e in events if e["type"] == "response.incomplete"))
    assert pending["reason"] == "waiting_for_required_input" and pending["stream_id"] == "p"
    assert pending["steer"] == accepted["steer"]
    assert pending["required_input"] == [
        {"type": "function_call_output", "call_id": "call_w1", "name": "get_weather"}
    ]
    missing, invalid = [e for e in events if e["type"] == "error"]
    assert missing["status"] == 400 and missing["error"]["code"] == "missing_required_input"
    assert "call_w1" in missing["error"]["message"] and missing["stream_id"] == "p"
    assert invalid["status"] == 400 and "call_nope" in invalid["error"]["message"]
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["previous_response_id"] == parent["id"]
    assert final["instructions"] == "own rules"  # the explicit create keeps its own settings
    body = upstream_bodies(upstream)[1]
    assert body["instructions"] == "own rules"
    assert texts(body)[-3:] == [
        ("function_call", "call_w1"),
        ("user", FAHRENHEIT),
        ("function_call_output", "call_w1"),
    ]
    assert sum(1 for t in texts(body) if t == ("user", FAHRENHEIT)) == 1
    assert len(upstream_bodies(upstream)) == 2


def test_a_completed_parent_with_client_calls_answers_pending_after_acceptance(
    gw: LiveServer, upstream: Any
) -> None:
    script(upstream, call("get_weather", '{"city": "Oslo"}', call_id="call_o"))

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(store=False, tools=[WEATHER_TOOL]))
            events = await c.until_terminal()
            await c.send(steer(events[0]["response"]["id"], "in Celsius"))
            events += await recv_until(c, "response.steer.pending")
            await c.nothing_more(0.3)
            return events

    events = run(scenario())
    assert kinds(events)[-3:] == ["response.completed", "response.steer.accepted", "response.steer.pending"]
    assert events[-1]["required_input"] == [
        {"type": "function_call_output", "call_id": "call_o", "name": "get_weather"}
    ]


# --- failures ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "needle"),
    [
        (steer("resp_x", stream_id="lane"), "stream_id"),
        (steer("resp_x", model="other"), "'model'"),
        (steer("resp_x", []), "empty array"),
        (steer("resp_x", 7), "string or an array"),
        (steer("resp_x", [{"role": "assistant", "content": "x"}]), "role must be 'user'"),
        (
            steer("resp_x", [{"type": "function_call_output", "call_id": "c", "output": "x"}]),
            "only user messages",
        ),
        (
            steer("resp_x", [{"role": "user", "content": [{"type": "input_file", "file_id": "file_1"}]}]),
            "file input is not supported",
        ),
        (steer("resp_x", [{"role": "user", "content": []}]), "non-empty array of content parts"),
        ({"type": "response.steer", "input": "x"}, "previous_response_id"),
    ],
)
def test_invalid_steering_is_refused_with_the_submitted_input(
    gw: LiveServer, upstream: Any, frame: dict[str, Any], needle: str
) -> None:
    async def scenario() -> dict[str, Any]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(frame)
            return await c.recv()

    event = run(scenario())
    # The echo is the submitted input as sent, so only its envelope is checked against the SDK.
    checked({**event, "steer": {**event["steer"], "input": ""}})
    assert event["type"] == "response.steer.failed"
    assert event["error"]["code"] == "invalid_input" and event["error"]["type"] == "invalid_request_error"
    assert needle in event["error"]["message"]
    assert event["steer"]["input"] == frame.get("input") and "id" not in event["steer"]
    assert upstream_bodies(upstream) == []


def test_unknown_foreign_and_expired_targets_are_not_found(
    gw: LiveServer, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    gateway_config(websocket__steer_target_ttl_s=0.2)
    script(upstream, text("one"))
    script(upstream, text("two"))
    script(upstream, text("over HTTP"))
    # HTTP/SSE has no steering: a response created over HTTP is no WebSocket target either.
    over_http = httpx.post(
        f"{gw.url}/v1/responses", json={"model": "test-model", "input": "hi", "stream": True}, timeout=30
    )
    assert over_http.status_code == 200
    http_id = orjson.loads(over_http.text.split("data: ", 1)[1].split("\n", 1)[0])["response"]["id"]

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as other:
            o = Client(other)
            await o.send(create(store=True))
            foreign = (await o.until_terminal())[0]["response"]["id"]
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(steer("resp_unknown"))
            out = [await c.recv()]
            await c.send(steer(foreign))  # stored, but not generated on this connection
            out.append(await c.recv())
            await c.send(steer(http_id))
            out.append(await c.recv())
            await c.send(create(stream_id="e", store=False))
            rid = (await c.until_terminal())[0]["response"]["id"]
            await asyncio.sleep(0.4)  # past the (shortened) 60 s expiry of completed targets
            await c.send(steer(rid))
            out.append(await c.recv())
            return out

    events = run(scenario())
    assert [checked(e)["error"]["code"] for e in events] == ["response_not_found"] * 4
    assert all(e["steer"]["input"] == FAHRENHEIT and "id" not in e["steer"] for e in events)
    assert len(upstream_bodies(upstream)) == 3


def test_queue_of_32_and_the_input_budget_answer_too_many_pending_steers(
    gw: LiveServer, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    gateway_config(websocket__steer_input_bytes=40_000)
    gate = Gate()
    gated(upstream, gate, text("a", "b"), hold_before="response.output_text.delta", nth=2)
    script(upstream, text("ok"))

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(store=False))
            events = await recv_until(c, "response.output_text.delta")
            rid = events[0]["response"]["id"]
            for n in range(33):
                await c.send(steer(rid, f"update {n}"))
            for _ in range(33):
                events.append(await c.recv())
            big = "x" * 39_000
            await c.send(steer(rid, big))
            events.append(await c.recv())
            gate.open()
            events += await c.until_terminal(2)
            return events

    events = run(scenario())
    accepted = control(events, "response.steer.accepted")
    failed = control(events, "response.steer.failed")
    assert len(accepted) == 32
    assert [f["error"]["code"] for f in failed] == ["too_many_pending_steers"] * 2
    assert failed[0]["steer"]["input"] == "update 32" and "id" not in failed[0]["steer"]
    assert failed[1]["steer"]["input"] == "x" * 39_000
    users = [t for t in texts(upstream_bodies(upstream)[1]) if t[0] == "user"]
    assert users[1:] == [("user", f"update {n}") for n in range(32)]


def test_the_input_budget_frees_when_the_successor_commits(
    gw: LiveServer, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    gateway_config(websocket__steer_input_bytes=30_000)
    script(upstream, text("one"))
    script(upstream, text("two"))
    script(upstream, text("three"))
    big = "y" * 20_000

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(store=False))
            first = (await c.until_terminal())[0]["response"]["id"]
            await c.send(steer(first, big))
            events = await c.until_terminal()
            second = next(e for e in events if e["type"] == "response.created")["response"]["id"]
            await c.send(steer(second, big))  # fits again: the first echo left the budget at commit
            events += await c.until_terminal()
            return events

    events = run(scenario())
    assert len(control(events, "response.steer.accepted")) == 2
    assert events[-1]["type"] == "response.completed"


def test_a_superseded_completed_target_answers_response_already_completed(
    gw: LiveServer, upstream: Any
) -> None:
    script(upstream, text("one"))
    script(upstream, text("two"))

    async def scenario() -> dict[str, Any]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="a", store=False))
            rid = (await c.until_terminal())[0]["response"]["id"]
            await c.send(create(stream_id="a", store=False, previous_response_id=rid, input="more"))
            await c.until_terminal()
            await c.send(steer(rid))
            return await c.recv()

    event = checked(run(scenario()))
    assert event["error"]["code"] == "response_already_completed" and event["stream_id"] == "a"
    assert event["steer"] == {
        "input": FAHRENHEIT,
        "previous_response_id": event["steer"]["previous_response_id"],
    }


def test_settings_over_budget_run_normally_but_refuse_steering(
    gw: LiveServer, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    gateway_config(websocket__steer_settings_bytes=2_000)
    script(upstream, text("fine"))
    script(upstream, text("continued"))

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(store=False, instructions="z" * 3_000))
            events = await c.until_terminal()
            rid = events[0]["response"]["id"]
            await c.send(steer(rid))
            events.append(await c.recv())
            await c.send(create(store=False, previous_response_id=rid, input="ordinary"))
            events += await c.until_terminal()
            return events

    events = run(scenario())
    assert events[0]["type"] == "response.created"
    [failed] = control(events, "response.steer.failed")
    assert failed["error"]["code"] == "response_not_active"
    assert events[-1]["type"] == "response.completed"  # ordinary continuation is unaffected


def test_settings_release_on_a_newer_response_and_eviction_under_pressure(
    gw: LiveServer, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    # Room for one target's settings (each carries ~1.2 kB of instructions).
    gateway_config(websocket__steer_settings_bytes=2_000)
    for n in range(3):
        script(upstream, text(f"answer {n}"))
    script(upstream, text("steered"))
    rules = "r" * 1_200

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="a", store=False, instructions=rules))
            a1 = (await c.until_terminal())[0]["response"]["id"]
            # A newer response.created on lane a releases a1's settings: a2 fits.
            await c.send(create(stream_id="a", store=False, instructions=rules, previous_response_id=a1))
            a2 = (await c.until_terminal())[0]["response"]["id"]
            # Lane b: a2 is completed and idle, so it is evicted to make room.
            await c.send(create(stream_id="b", store=False, instructions=rules))
            b1 = (await c.until_terminal())[0]["response"]["id"]
            out = []
            for rid in (a1, a2, b1):
                await c.send(steer(rid))
                out += await recv_until(
                    c, "response.steer.failed" if rid != b1 else "response.steer.accepted"
                )
            out += await c.until_terminal()
            return out

    events = run(scenario())
    codes = [e["error"]["code"] for e in control(events, "response.steer.failed")]
    assert codes == ["response_already_completed", "response_not_found"]
    assert len(control(events, "response.steer.accepted")) == 1
    assert events[-1]["type"] == "response.completed"


def test_a_pending_batch_keeps_its_settings_under_pressure(
    gw: LiveServer, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    gateway_config(websocket__steer_settings_bytes=2_000)
    script(upstream, call("get_weather", "{}", call_id="call_k"))
    script(upstream, text("other lane"))
    rules = "r" * 1_200

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="a", store=False, instructions=rules, tools=[WEATHER_TOOL]))
            a1 = (await c.until_terminal())[0]["response"]["id"]
            await c.send(steer(a1))
            events = await recv_until(c, "response.steer.pending")
            await c.send(create(stream_id="b", store=False, instructions=rules))
            events += await c.until_terminal()
            b1 = events[-1]["response"]["id"]
            await c.send(steer(b1))
            events.append(await c.recv())
            return events

    events = run(scenario())
    [failed] = control(events, "response.steer.failed")
    assert failed["error"]["code"] == "response_not_active" and failed["stream_id"] == "b"


def test_prewarm_and_conversation_targets_do_not_support_steering(gw: LiveServer, upstream: Any) -> None:
    script(upstream, text("in a conversation"))
    conversation = httpx.post(f"{gw.url}/v1/conversations", json={}, timeout=10).json()["id"]

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="w", store=False, generate=False))
            warm = (await c.until_terminal())[0]["response"]["id"]
            await c.send(steer(warm))
            out = [await c.recv()]
            await c.send(create(stream_id="c", conversation=conversation))
            bound = (await c.until_terminal())[0]["response"]["id"]
            await c.send(steer(bound))
            out.append(await c.recv())
            return out

    events = run(scenario())
    assert [checked(e)["error"]["code"] for e in events] == ["steering_not_supported"] * 2
    assert "Prewarm" in events[0]["error"]["message"] and events[0]["stream_id"] == "w"
    assert "conversation" in events[1]["error"]["message"]


def test_context_management_and_compaction_targets_do_not_support_steering(
    gw: LiveServer, upstream: Any
) -> None:
    """Compaction/context-management requests are out of steering's scope: a response created with
    ``context_management`` (threshold not reached, so it generated normally) and a Codex
    ``compaction_trigger`` response both refuse steering with ``steering_not_supported``."""
    script(upstream, text("an answer"))
    script(upstream, text("A summary."))

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            managed = [{"type": "compaction", "compact_threshold": 1_000_000}]
            await c.send(create(stream_id="m", store=False, context_management=managed))
            first = (await c.until_terminal())[-1]
            assert first["type"] == "response.completed", first
            await c.send(steer(first["response"]["id"]))
            out = [await c.recv()]
            trigger = [
                {"type": "message", "role": "user", "content": "hello"},
                {"type": "compaction_trigger"},
            ]
            await c.send(create(stream_id="t", store=False, input=trigger))
            second = (await c.until_terminal())[-1]
            assert second["type"] == "response.completed", second
            await c.send(steer(second["response"]["id"]))
            out.append(await c.recv())
            return out

    events = run(scenario())
    assert [checked(e)["error"]["code"] for e in events] == ["steering_not_supported"] * 2
    assert all("ompaction" in e["error"]["message"] for e in events)
    assert [e["stream_id"] for e in events] == ["m", "t"]


def test_a_truncated_stream_fails_the_parent_and_returns_accepted_steering(
    gw: LiveServer, upstream: Any
) -> None:
    gate = Gate()
    # The stream ends inside the message: nothing establishes that the started item settled.
    gated(
        upstream,
        gate,
        text("half", " of it"),
        hold_before="response.output_text.delta",
        nth=2,
        truncate_after=6,
    )

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="t", store=False))
            events = await recv_until(c, "response.output_text.delta")
            await c.send(steer(events[0]["response"]["id"]))
            events += await recv_until(c, "response.steer.accepted")
            gate.open()
            events += await recv_until(c, "response.steer.failed")
            await c.nothing_more(0.3)
            return events

    events = run(scenario())
    assert kinds(events)[-2:] == ["response.failed", "response.steer.failed"]  # control after terminal
    [accepted] = control(events, "response.steer.accepted")
    failed = checked(events[-1])
    assert failed["error"]["code"] == "response_not_active"
    assert failed["steer"] == {**accepted["steer"], "input": FAHRENHEIT}
    assert failed["stream_id"] == "t"
    assert len(upstream_bodies(upstream)) == 1  # no successor


def test_successor_creation_failure_returns_the_steering_id(
    gw: LiveServer, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    gateway_config(websocket__max_checkpoint_bytes=8_000)
    script(upstream, text("short"))
    big = "s" * 10_000  # the successor's checkpoint would exceed max_checkpoint_bytes

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(store=False))
            events = await c.until_terminal()
            await c.send(steer(events[0]["response"]["id"], big))
            events += await recv_until(c, "response.steer.failed")
            return events

    events = run(scenario())
    [accepted] = control(events, "response.steer.accepted")
    failed = checked(events[-1])
    assert failed["error"]["code"] == "successor_creation_failed"
    assert failed["steer"] == {**accepted["steer"], "input": big}
    assert len(upstream_bodies(upstream)) == 1


def test_after_the_successor_exists_a_failure_does_not_return_the_input(
    gw: LiveServer, upstream: Any
) -> None:
    script(upstream, text("fine"))
    script(upstream, error_status=500)

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(store=False))
            events = await c.until_terminal()
            await c.send(steer(events[0]["response"]["id"]))
            events += await c.until_terminal()
            await c.nothing_more(0.4)
            return events

    events = run(scenario())
    assert kinds(events)[-3:] == ["response.created", "response.in_progress", "response.failed"]
    assert not control(events, "response.steer.failed")


def test_exhausting_failure_delivery_capacity_closes_the_connection(
    gw: LiveServer, gateway_config: Callable[..., Any]
) -> None:
    gateway_config(websocket__steer_failure_bytes=4_096)

    async def scenario() -> tuple[list[dict[str, Any]], int | None, str]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(steer("resp_nope", "small"))
            events = [await c.recv()]
            await c.send(steer("resp_nope", "x" * 5_000))  # its echo cannot fit in the allowance
            with pytest.raises(websockets.ConnectionClosed):
                await c.recv()
            assert ws.close_code is not None
            return events, ws.close_code, ws.close_reason or ""

    events, code, reason = run(scenario())
    assert events[0]["error"]["code"] == "response_not_found"
    assert code == 1008 and "steering failure" in reason


def test_disconnect_discards_unapplied_steering_even_for_a_stored_parent(
    gw: LiveServer, upstream: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from responses_app.features import steering

    discarded = threading.Event()  # the server handled the close (its steering discarded)
    discard = steering.Steering.discard

    def discarding(self: steering.Steering) -> None:
        discard(self)
        discarded.set()

    monkeypatch.setattr(steering.Steering, "discard", discarding)
    gate = Gate()
    gated(upstream, gate, text("whole ", "answer"), hold_before="response.output_text.delta", nth=2)

    async def scenario() -> str:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(store=True))
            events = await recv_until(c, "response.output_text.delta")
            rid = events[0]["response"]["id"]
            await c.send(steer(rid))
            await recv_until(c, "response.steer.accepted")
        return str(rid)

    rid = run(scenario())
    # The upstream goes on once the server has handled the close (were steering still held, the
    # parent would stop at the next boundary).
    assert discarded.wait(10)
    gate.open()
    for _ in range(500):
        row = Response.objects.filter(id=rid).first()
        if row is not None and row.status != "in_progress":
            break
        asyncio.run(asyncio.sleep(0.02))
    row = Response.objects.get(id=rid)
    assert row.status == "completed" and row.snapshot["incomplete_details"] is None
    assert Response.objects.count() == 1  # no successor
    assert len(upstream_bodies(upstream)) == 1


def test_pending_lists_custom_shell_and_client_tool_search_stubs(gw: LiveServer, upstream: Any) -> None:
    custom = {"type": "custom", "name": "patch", "description": "Apply a patch."}
    tools = [
        custom,
        {"type": "shell"},
        {"type": "tool_search", "execution": "client"},
        {"type": "apply_patch"},
    ]
    script(
        upstream,
        call("patch", '{"input": "*** patch"}', call_id="call_c"),
        call("shell", '{"commands": ["ls"]}', call_id="call_sh"),
        call("tool_search", '{"query": "weather"}', call_id="call_ts"),
        call("apply_patch", '{"type": "delete_file", "path": "a"}', call_id="call_ap"),
    )
    script(upstream, text("all answered"))
    outputs = [
        {"type": "custom_tool_call_output", "call_id": "call_c", "output": "patched"},
        {
            "type": "shell_call_output",
            "call_id": "call_sh",
            "output": [{"stdout": "a\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}],
        },
        {"type": "tool_search_output", "call_id": "call_ts", "execution": "client", "tools": [WEATHER_TOOL]},
        {"type": "apply_patch_call_output", "call_id": "call_ap", "status": "completed"},
    ]

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="k", store=False, tools=tools, parallel_tool_calls=True))
            events = await c.until_terminal()
            rid = events[0]["response"]["id"]
            await c.send(steer(rid, "then stop"))
            events += await recv_until(c, "response.steer.pending")
            await c.send(
                create(stream_id="k", store=False, previous_response_id=rid, input=outputs, tools=tools)
            )
            events += await c.until_terminal()
            return events

    events = run(scenario())
    [pending] = control(events, "response.steer.pending")
    assert pending["required_input"] == [
        {"type": "custom_tool_call_output", "call_id": "call_c"},
        {"type": "shell_call_output", "call_id": "call_sh"},
        {"type": "tool_search_output", "call_id": "call_ts", "execution": "client"},
        {"type": "apply_patch_call_output", "call_id": "call_ap"},
    ]
    assert events[-1]["type"] == "response.completed"
    body = upstream_bodies(upstream)[1]
    users = [t for t in texts(body) if t[0] == "user"]
    assert users[-1] == ("user", "then stop")


def test_a_successor_takes_over_its_parents_settings_budget(
    gw: LiveServer, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    gateway_config(websocket__steer_settings_bytes=2_000)  # room for one target's settings
    for n in range(3):
        script(upstream, text(f"answer {n}"))

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(store=False, instructions="r" * 1_200))
            events = await c.until_terminal()
            await c.send(steer(events[0]["response"]["id"], "again"))
            events += await c.until_terminal()
            successor = [e for e in events if e["type"] == "response.created"][-1]["response"]["id"]
            await c.send(steer(successor, "and again"))  # the successor is steerable in its turn
            events += await c.until_terminal()
            return events

    events = run(scenario())
    assert len(control(events, "response.steer.accepted")) == 2
    assert not control(events, "response.steer.failed")
    assert [e["type"] for e in events if e["type"] in TERMINAL] == ["response.completed"] * 3
