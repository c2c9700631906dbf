"""WS /v1/responses against a live gateway: the SDK's ``responses.connect()`` and a raw client.

Spec: "WS /v1/responses" in gateway-api.txt (everything but ``response.steer``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from conversations_app.models import Item
from gateway.core.principal import Principal
from responses_app.models import Response
from tests.responses.scripts import Script, handler, text
from tests.responses.wsutil import Client, RawSocketClient, connect, create, lane
from tests.servers import LiveServer
from tests.upstream import Meeting, Recorded

NOT_FOUND = "Previous response with id '{}' not found."


@pytest.fixture
def gw(live_gateway: LiveServer, upstream: Any, gateway_config: Callable[..., Any]) -> Iterator[Any]:
    gateway_config(llm_api_base=upstream.url, upstream_api="responses")
    yield live_gateway


def script(upstream: Any, *chunks: str, **options: Any) -> None:
    upstream.script("/v1/responses", handler(Script([text(*chunks)], **options)))


def upstream_bodies(upstream: Any) -> list[dict[str, Any]]:
    return [r.json() for r in upstream.requests if r.path == "/v1/responses"]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- event order, stream_id echo, the SDK ----------------------------------------------------


def test_sdk_connect_streams_events_with_stream_id(gw: LiveServer, upstream: Any) -> None:
    script(upstream, "Hello", " there")

    async def scenario() -> list[Any]:
        client = AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="sk-test", max_retries=0)
        events = []
        async with client.responses.connect() as conn:
            await conn.send(
                {"type": "response.create", "model": "test-model", "input": "hi", "stream_id": "turn-1"}
            )
            async for event in conn:
                events.append(event)
                if event.type in ("response.completed", "error"):
                    break
        await client.close()
        return events

    events = run(scenario())
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert all(e.stream_id == "turn-1" for e in events)
    assert [e.sequence_number for e in events] == list(range(10))
    assert events[-1].response.output[0].content[0].text == "Hello there"


def test_sdk_connect_receives_error_events(gw: LiveServer) -> None:
    async def scenario() -> Any:
        client = AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="sk-test", max_retries=0)
        async with client.responses.connect() as conn:
            await conn.send(
                {
                    "type": "response.create",
                    "model": "test-model",
                    "input": "hi",
                    "stream_id": "turn-1",
                    "store": False,
                    "previous_response_id": "resp_missing",
                }
            )
            event = await conn.recv()
        await client.close()
        return event

    event = run(scenario())
    assert event.type == "error" and event.stream_id == "turn-1" and event.status == 400
    assert event.error.message == "Previous response with id 'resp_missing' not found."
    assert event.error.code == "previous_response_not_found"
    assert event.error.param == "previous_response_id"
    assert event.error.type == "invalid_request_error"


def test_default_lane_events_carry_no_stream_id(gw: LiveServer, upstream: Any) -> None:
    script(upstream, "ok")

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(store=False))
            return await c.until_terminal()

    events = run(scenario())
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    assert all("stream_id" not in e for e in events)
    body = upstream_bodies(upstream)[0]
    assert "stream_id" not in body and "generate" not in body and body["stream"] is True


# --- lanes -------------------------------------------------------------------------------------


def test_lanes_run_concurrently_and_fifo_within_a_lane(gw: LiveServer, upstream: Any) -> None:
    # Lanes a and b: each answer waits at the upstream until both requests are there.
    meeting = Meeting(upstream, 2)
    for _ in range(2):
        upstream.script("/v1/responses", meeting.handler(handler(Script([text("slow", " answer")]))))
    # Two requests on lane a: the first one's answer is slow; the second must wait for it.
    for _ in range(2):
        script(upstream, "slow", " answer", delay_s=0.05)

    async def scenario() -> tuple[int, list[dict[str, Any]], int]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="a", store=False, input="a1"))
            await c.send(create(stream_id="b", store=False, input="b1"))
            await c.until_terminal(2)
            parallel = upstream.peak_in_flight
            while upstream.in_flight:  # the upstream's handlers are returning
                await asyncio.sleep(0.01)
            upstream.peak_in_flight = 0
            await c.send(create(stream_id="a", store=False, input="a2"))
            await c.send(create(stream_id="a", store=False, input="a3"))
            events = await c.until_terminal(2)
            return parallel, events, upstream.peak_in_flight

    parallel, events, serial = run(scenario())
    assert parallel == 2, "two lanes did not run concurrently"
    assert serial == 1, "two requests of one lane overlapped at the upstream"
    kinds = [e["type"] for e in events]
    # FIFO: the second request's response.created comes after the first one's response.completed.
    first_done = kinds.index("response.completed")
    second_created = [i for i, k in enumerate(kinds) if k == "response.created"][1]
    assert second_created > first_done
    assert all(e["stream_id"] == "a" for e in events)
    inputs = [b["input"][-1]["content"][0]["text"] for b in upstream_bodies(upstream)[2:]]
    assert inputs == ["a2", "a3"]


# --- connection-local state --------------------------------------------------------------------


def test_store_false_continuation_and_its_loss_after_reconnect(gw: LiveServer, upstream: Any) -> None:
    script(upstream, "first answer")
    script(upstream, "second answer")

    async def scenario() -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="s", store=False, input="one"))
            first = await c.until_terminal()
            rid = first[-1]["response"]["id"]
            await c.send(create(stream_id="s", store=False, previous_response_id=rid, input="two"))
            second = await c.until_terminal()
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="s", store=False, previous_response_id=rid, input="three"))
            lost = await c.recv()
        return rid, second, lost

    rid, second, lost = run(scenario())
    assert second[-1]["type"] == "response.completed"
    assert second[-1]["response"]["previous_response_id"] == rid
    history = upstream_bodies(upstream)[1]["input"]
    assert [i.get("role") for i in history] == ["user", "assistant", "user"]
    assert history[1]["content"][0]["text"] == "first answer"
    assert lost == {
        "type": "error",
        "stream_id": "s",
        "status": 400,
        "error": {
            "message": NOT_FOUND.format(rid),
            "type": "invalid_request_error",
            "code": "previous_response_not_found",
            "param": "previous_response_id",
        },
    }
    assert len(upstream_bodies(upstream)) == 2  # the lost continuation never reached the model
    assert not Response.objects.exists() and not Item.objects.exists()


def test_store_true_uncached_parent_loads_from_storage(gw: LiveServer, upstream: Any) -> None:
    script(upstream, "stored answer")
    script(upstream, "continued")

    async def scenario() -> tuple[str, list[dict[str, Any]]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="s", store=True, input="one"))
            rid = (await c.until_terminal())[-1]["response"]["id"]
        async with await connect(gw.url) as ws:  # a new connection: nothing cached
            c = Client(ws)
            await c.send(create(stream_id="s", store=True, previous_response_id=rid, input="two"))
            return rid, await c.until_terminal()

    rid, events = run(scenario())
    assert events[-1]["type"] == "response.completed"
    history = upstream_bodies(upstream)[1]["input"]
    assert history[1]["content"][0]["text"] == "stored answer"
    assert Response.objects.filter(id=rid).exists()
    assert Response.objects.get(id=events[-1]["response"]["id"]).previous_response_id == rid


def test_prewarm_emits_created_then_completed_without_inference(gw: LiveServer, upstream: Any) -> None:
    script(upstream, "after prewarm")

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(
                create(stream_id="w", store=False, generate=False, instructions="Be brief.", input="warm")
            )
            warm = await c.until_terminal()
            await c.nothing_more(0.3)
            assert upstream_bodies(upstream) == []
            rid = warm[0]["response"]["id"]
            await c.send(create(stream_id="w", store=False, previous_response_id=rid, input="go"))
            return warm, await c.until_terminal()

    warm, turn = run(scenario())
    assert [e["type"] for e in warm] == ["response.created", "response.completed"]
    assert [e["sequence_number"] for e in warm] == [0, 1]
    assert all(e["stream_id"] == "w" for e in warm)
    assert warm[0]["response"]["status"] == "in_progress"
    assert warm[1]["response"]["status"] == "completed" and warm[1]["response"]["output"] == []
    assert warm[0]["response"]["id"] == warm[1]["response"]["id"]
    assert turn[-1]["type"] == "response.completed"
    body = upstream_bodies(upstream)[0]
    assert [i["content"][0]["text"] for i in body["input"]] == ["warm", "go"]
    assert not Response.objects.exists()  # store:false: nothing reached the database


def test_prewarm_with_store_true_is_stored(gw: LiveServer) -> None:
    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="w", store=True, generate=False))
            return await c.until_terminal()

    warm = run(scenario())
    stored = Response.objects.get(id=warm[1]["response"]["id"])
    assert stored.status == "completed" and stored.snapshot["output"] == []


# --- failure and eviction rules ----------------------------------------------------------------


def test_failed_same_lane_continuation_evicts_its_cached_parent(gw: LiveServer, upstream: Any) -> None:
    script(upstream, error_status=500)

    async def scenario() -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="a", store=False, generate=False))
            rid = (await c.until_terminal())[0]["response"]["id"]
            await c.send(create(stream_id="a", store=False, previous_response_id=rid, input="x"))
            failed = await c.until_terminal()
            await c.send(create(stream_id="a", store=False, previous_response_id=rid, input="y"))
            return rid, failed, await c.recv()

    rid, failed, after = run(scenario())
    assert failed[-1]["type"] == "response.failed" and failed[-1]["stream_id"] == "a"
    assert after["status"] == 400 and after["error"]["code"] == "previous_response_not_found"
    assert after["error"]["message"] == NOT_FOUND.format(rid)


def test_failed_fork_keeps_the_source_lanes_parent(gw: LiveServer, upstream: Any) -> None:
    script(upstream, error_status=500)
    script(upstream, "source lane continues")

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="a", store=False, generate=False))
            rid = (await c.until_terminal())[0]["response"]["id"]
            await c.send(create(stream_id="b", store=False, previous_response_id=rid, input="fork"))
            fork = await c.until_terminal()
            await c.send(create(stream_id="a", store=False, previous_response_id=rid, input="same"))
            return fork, await c.until_terminal()

    fork, same = run(scenario())
    assert fork[-1]["type"] == "response.failed" and fork[-1]["stream_id"] == "b"
    assert same[-1]["type"] == "response.completed" and same[-1]["stream_id"] == "a"


def test_invalid_same_lane_continuation_also_evicts(gw: LiveServer) -> None:
    """A continuation that fails validation at execution (unknown call_id) is a failed continuation."""

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="a", store=False, generate=False))
            rid = (await c.until_terminal())[0]["response"]["id"]
            bad = [{"type": "function_call_output", "call_id": "nope", "output": "x"}]
            await c.send(create(stream_id="a", store=False, previous_response_id=rid, input=bad))
            first = await c.recv()
            await c.send(create(stream_id="a", store=False, previous_response_id=rid, generate=False))
            return first, await c.recv()

    first, second = run(scenario())
    assert first["status"] == 400 and first["stream_id"] == "a"
    assert first["error"]["message"] == "No tool call found for function call output with call_id nope."
    assert second["error"]["code"] == "previous_response_not_found"


# --- limits ------------------------------------------------------------------------------------


def test_outstanding_request_limit_answers_429_and_keeps_state(
    gw: LiveServer, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    gateway_config(llm_api_base=upstream.url, websocket__max_outstanding_requests=2)
    script(upstream, "one", delay_s=0.05)
    script(upstream, "two", delay_s=0.05)

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="a", store=False, generate=False))
            rid = (await c.until_terminal())[0]["response"]["id"]
            await c.send(create(stream_id="a", store=False, previous_response_id=rid, input="1"))
            await c.send(create(stream_id="b", store=False, input="2"))
            await c.send(create(stream_id="c", store=False, input="3"))
            events = await c.until_terminal(3)
            # Capacity is back: a new request is admitted, and the lane's checkpoint survived.
            latest = next(e for e in lane(events, "a") if e["type"] == "response.completed")["response"]["id"]
            await c.send(create(stream_id="a", store=False, previous_response_id=latest, generate=False))
            return events, await c.until_terminal()

    events, after = run(scenario())
    refused = [e for e in events if e["type"] == "error"]
    assert refused == [
        {
            "type": "error",
            "stream_id": "c",
            "status": 429,
            "error": {
                "message": "Too many outstanding requests on this WebSocket connection (at most 2); "
                "wait for a response to finish.",
                "type": "rate_limit_error",
                "code": "rate_limit_exceeded",
                "param": None,
            },
        }
    ]
    assert {e["stream_id"] for e in events if e["type"] == "response.completed"} == {"a", "b"}
    assert len(upstream_bodies(upstream)) == 2
    assert after[-1]["type"] == "response.completed"


def test_outstanding_bytes_limit_answers_429(
    gw: LiveServer, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    gateway_config(llm_api_base=upstream.url, websocket__max_outstanding_request_bytes=3000)
    script(upstream, "slow", delay_s=0.05)

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="a", store=False, input="x" * 2000))
            await c.send(create(stream_id="b", store=False, input="y" * 2000))
            return await c.until_terminal(2)

    events = run(scenario())
    refused = [e for e in events if e["type"] == "error"]
    assert len(refused) == 1 and refused[0]["stream_id"] == "b" and refused[0]["status"] == 429
    assert refused[0]["error"]["code"] == "rate_limit_exceeded"
    assert "3000 bytes" in refused[0]["error"]["message"]
    assert lane(events, "a")[-1]["type"] == "response.completed"


def test_lane_limit_counts_the_default_lane(
    gw: LiveServer, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    gateway_config(llm_api_base=upstream.url, websocket__max_lanes=2)

    async def scenario() -> list[dict[str, Any]]:
        out = []
        async with await connect(gw.url) as ws:
            c = Client(ws)
            for stream_id in ("a", None, "b", "a"):
                fields = {"stream_id": stream_id} if stream_id else {}
                await c.send(create(store=False, generate=False, **fields))
                out.append((await c.until_terminal())[-1])
        return out

    a, default, b, a_again = run(scenario())
    assert a["type"] == default["type"] == a_again["type"] == "response.completed"
    assert b["type"] == "error" and b["status"] == 429 and b["stream_id"] == "b"
    assert b["error"]["message"] == (
        "This WebSocket connection already has 2 lanes (stream_id values, the default lane included); "
        "reconnect to start new lanes."
    )


def test_checkpoint_item_limit_answers_413_before_writing_state(
    gw: LiveServer, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    gateway_config(llm_api_base=upstream.url, websocket__max_checkpoint_items=3)

    async def scenario() -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="a", store=True, generate=False, input=["u1", "u2"][0]))
            rid = (await c.until_terminal())[0]["response"]["id"]
            three = [{"role": "user", "content": f"m{i}"} for i in range(3)]
            await c.send(create(stream_id="a", store=True, previous_response_id=rid, input=three))
            refused = await c.recv()
            # The lane's checkpoint is untouched: a fitting continuation still works.
            await c.send(create(stream_id="a", store=False, previous_response_id=rid, generate=False))
            return rid, refused, await c.until_terminal()

    rid, refused, after = run(scenario())
    assert refused == {
        "type": "error",
        "stream_id": "a",
        "status": 413,
        "error": {
            "message": "The response checkpoint would hold 4 items; at most 3 items are retained per checkpoint.",
            "type": "invalid_request_error",
            "code": "checkpoint_too_large",
            "param": None,
        },
    }
    assert after[-1]["type"] == "response.completed"
    assert list(Response.objects.values_list("id", flat=True)) == [rid]  # the refused one was not stored
    assert upstream_bodies(upstream) == []


def test_checkpoint_byte_limits_answer_413(
    gw: LiveServer, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    gateway_config(
        llm_api_base=upstream.url,
        websocket__max_checkpoint_bytes=4000,
        websocket__max_connection_checkpoint_bytes=6000,
    )

    async def scenario() -> list[dict[str, Any]]:
        out = []
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="a", store=False, generate=False, input="x" * 5000))
            out.append(await c.recv())  # one checkpoint over 4000 bytes
            await c.send(create(stream_id="a", store=False, generate=False, input="x" * 2500))
            out.extend(await c.until_terminal())  # fits: ~2.7 kB cached
            await c.send(create(stream_id="b", store=False, generate=False, input="y" * 3500))
            out.append(await c.recv())  # 2.7 kB cached + ~3.7 kB prepared > 6000
        return out

    too_big, _created, completed, over_budget = run(scenario())
    assert too_big["status"] == 413 and too_big["error"]["code"] == "checkpoint_too_large"
    assert "at most 4000 bytes are retained per checkpoint" in too_big["error"]["message"]
    assert completed["type"] == "response.completed"
    assert over_budget["status"] == 413 and over_budget["stream_id"] == "b"
    assert over_budget["error"]["code"] == "checkpoint_budget_exceeded"
    assert "checkpoint budget of 6000 bytes" in over_budget["error"]["message"]


def test_max_stream_event_bytes_counts_the_stream_id(
    gw: LiveServer, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    async def prewarm(stream_id: str) -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id=stream_id, store=True, generate=False))
            events = await c.until_terminal()
            await c.nothing_more(0.2)
            return events

    events = run(prewarm("a"))
    largest = max(len(orjson.dumps(e)) for e in events)
    gateway_config(llm_api_base=upstream.url, responses__max_stream_event_bytes=largest + 20)
    assert [e["type"] for e in run(prewarm("b"))] == ["response.created", "response.completed"]
    stored_before = Response.objects.count()
    refused = run(prewarm("c" * 100))  # the same events, 99 bytes longer with this stream_id
    assert [e["type"] for e in refused] == ["error"]  # neither lifecycle event was sent
    assert refused[0]["status"] == 413 and refused[0]["error"]["code"] == "event_too_large"
    assert refused[0]["stream_id"] == "c" * 100
    assert Response.objects.count() == stored_before  # and nothing was stored


# --- identity expiry -----------------------------------------------------------------------------


class WithPrincipal:
    """Puts a principal with a near expiry into the WebSocket scope (what the auth layer does)."""

    def __init__(self, app: Any, expires_at: float) -> None:
        self.app = app
        self.expires_at = expires_at

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            scope["principal"] = Principal(owner="oidc:test#alice", kind="oidc", expires_at=self.expires_at)
        await self.app(scope, receive, send)


def test_token_expiry_refuses_new_and_queued_work(
    transactional_db: None, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    from channels.routing import URLRouter

    from gateway.core.middleware import GatewayASGIMiddleware
    from gateway.routing import websocket_urlpatterns

    gateway_config(llm_api_base=upstream.url, upstream_api="responses")
    script(upstream, "slow", " first", delay_s=0.15)  # ~1.8 s, outlives the token
    # The principal is placed where the auth middleware would put it (right above the router).
    app = GatewayASGIMiddleware(WithPrincipal(URLRouter(websocket_urlpatterns), time.time() + 1.0))
    server = LiveServer(app).start()
    try:

        async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any]]:
            async with await connect(server.url) as ws:
                c = Client(ws)
                await c.send(create(store=False, input="first"))  # default lane, starts now
                await c.send(create(store=False, input="queued"))  # waits behind it
                events = await c.until_terminal(2)
                await c.send(create(stream_id="late", store=False, input="new"))
                return events, await c.recv()

        events, late = run(scenario())
    finally:
        server.stop()
    assert [e["type"] for e in events if e["type"] in ("response.completed", "error")] == [
        "response.completed",
        "error",
    ]
    queued = events[-1]
    expired = {
        "status": 401,
        "error": {
            "message": "invalid bearer token",
            "type": "authentication_error",
            "code": "invalid_token",
            "param": None,
        },
    }
    assert queued == {"type": "error", **expired}  # the default lane: tagged without a stream_id
    assert late == {"type": "error", "stream_id": "late", **expired}
    assert len(upstream_bodies(upstream)) == 1  # neither refused request reached inference


# --- malformed and refused frames ----------------------------------------------------------------


def test_malformed_and_refused_frames_get_error_events(gw: LiveServer, upstream: Any) -> None:
    script(upstream, "still alive")

    async def scenario() -> list[dict[str, Any]]:
        out = []
        async with await connect(gw.url) as ws:
            c = Client(ws)
            frames: list[Any] = [
                "{not json",
                "[1, 2]",
                {"type": "response.cancel", "stream_id": "x"},
                {"model": "test-model"},
                create(stream_id=""),
                create(stream_id="s" * 257),
                create(stream_id=7),
                create(stream_id="m", model=None),
                create(stream_id="bg", background=True),
                create(stream_id="ma", multi_agent={"enabled": True}),
                create(stream_id="g", generate="no"),
            ]
            for frame in frames:
                await c.send(frame)
                out.append(await c.recv())
            await ws.send(b"\x00binary")
            out.append(await c.recv())
            await c.send(create(stream_id="ok", store=False))  # the connection still works
            out.extend(await c.until_terminal())
        return out

    events = run(scenario())
    errs = events[:12]
    assert all(e["type"] == "error" and e["status"] == 400 for e in errs)
    codes = [(e.get("stream_id"), e["error"]["code"], e["error"]["param"]) for e in errs]
    assert codes == [
        (None, "invalid_json", None),
        (None, "invalid_json", None),
        ("x", "unknown_event_type", "type"),
        (None, "unknown_event_type", "type"),
        (None, "invalid_value", "stream_id"),
        (None, "invalid_value", "stream_id"),
        (None, "invalid_type", "stream_id"),
        ("m", "invalid_type", "model"),
        ("bg", "unsupported_parameter", "background"),
        ("ma", "unsupported_parameter", "multi_agent"),
        ("g", "invalid_type", "generate"),
        (None, "invalid_json", None),
    ]
    assert errs[2]["error"]["message"] == (
        "Unsupported WebSocket event type 'response.cancel'. This endpoint accepts 'response.create' and 'response.steer'."
    )
    assert errs[4]["error"]["message"] == "Invalid 'stream_id': it must contain between 1 and 256 characters."
    assert events[-1]["type"] == "response.completed" and events[-1]["stream_id"] == "ok"
    assert len(upstream_bodies(upstream)) == 1


# --- a client that stops reading -------------------------------------------------------------------


@pytest.mark.slow  # ~50 MB of deltas through the socket buffers: seconds of CPU (make test runs it)
def test_a_client_that_stops_reading_is_closed_with_1008(
    gw: LiveServer, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    gateway_config(
        llm_api_base=upstream.url,
        websocket__send_timeout_s=1.0,
        websocket__outbound_queue_events=8,
        responses__max_retained_bytes=128 * 1024 * 1024,
    )
    chunk = "z" * 16384
    total = 3000  # ~50 MB of deltas: far more than the socket buffers on both sides hold
    progress = {"written": 0, "finished": False}

    async def flood(request: web.Request, rec: Recorded) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        frames = [
            b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
            for kind, data in __import__("tests.responses.scripts", fromlist=["x"]).responses_events(
                Script([text(*([chunk] * total))]), rec.json()
            )
        ]
        try:
            for frame in frames:
                await response.write(frame)
                progress["written"] += 1
            await response.write_eof()
            progress["finished"] = True
        except (ConnectionResetError, RuntimeError, asyncio.CancelledError):
            pass
        return response

    upstream.script("/v1/responses", flood)

    client = RawSocketClient(gw.port)
    try:
        client.send_text(orjson.dumps(create(stream_id="slow", store=False)).decode())
        time.sleep(3.0)  # read nothing, well past send_timeout_s
        stalled_at = progress["written"]
        events, code, reason = client.read_all()
    finally:
        client.close()
    received = len(events)
    assert code == 1008
    assert reason == "send deadline exceeded: the client is not reading events"
    assert received < total  # the stream was cut off, not buffered for the client
    assert not progress["finished"]  # the gateway stopped pulling the upstream stream
    assert stalled_at < total


def test_stored_continuation_of_an_unstored_parent_stores_the_whole_history(
    gw: LiveServer, upstream: Any
) -> None:
    script(upstream, "stored now")

    async def scenario() -> str:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="a", store=False, generate=False, input="from memory"))
            rid = (await c.until_terminal())[0]["response"]["id"]
            await c.send(create(stream_id="a", store=True, previous_response_id=rid, input="then stored"))
            return str((await c.until_terminal())[-1]["response"]["id"])

    rid = run(scenario())
    stored = Response.objects.get(id=rid)
    items = Item.objects.filter(id__in=stored.history_item_ids)
    assert items.count() == len(stored.history_item_ids) == 3  # parent input, new input, output


def test_conversation_requests_keep_the_conversations_behaviour(gw: LiveServer, upstream: Any) -> None:
    """Over WebSocket, ``conversation`` reads history from and appends to the durable conversation."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{gw.url}/v1", api_key="x", max_retries=0)
    conv = client.conversations.create(items=[{"type": "message", "role": "user", "content": "before"}])
    script(upstream, "over the socket")

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="c", conversation=conv.id, input="now"))
            return await c.until_terminal()

    events = run(scenario())
    assert events[-1]["type"] == "response.completed" and events[-1]["stream_id"] == "c"
    sent = upstream_bodies(upstream)[-1]["input"]
    assert [part["text"] for item in sent for part in item["content"]] == ["before", "now"]
    items = client.conversations.items.list(conv.id, order="asc").data
    texts = [item.content[0].text for item in items]  # type: ignore[union-attr]
    assert texts == ["before", "now", "over the socket"]
    # previous_response_id together with conversation is refused here too, before inference.
    before = len(upstream_bodies(upstream))

    async def refused() -> dict[str, Any]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(stream_id="d", conversation=conv.id, previous_response_id="resp_x"))
            return await c.recv()

    error = run(refused())
    assert error["type"] == "error" and error["status"] == 400 and error["stream_id"] == "d"
    assert len(upstream_bodies(upstream)) == before
    client.close()


@pytest.mark.parametrize("tier", ["fast", "ultrafast"])
def test_any_service_tier_is_forwarded_unchanged(gw: LiveServer, upstream: Any, tier: str) -> None:
    """The openai 3.57 SDK allows "fast" and "ultrafast"; an explicit tier is forwarded as is."""
    script(upstream, "ok", service_tier=tier)

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(service_tier=tier))
            return await c.until_terminal()

    events = run(scenario())
    assert events[-1]["type"] == "response.completed", events[-1]
    assert events[-1]["response"]["service_tier"] == tier
    assert upstream_bodies(upstream)[0]["service_tier"] == tier
