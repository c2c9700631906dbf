"""A hostile upstream never crashes the executor: every malformed stream ends ``failed``.

The scripted upstream sends vLLM's own stream with one member made wrong (tests/responses/hostile.py)
on both executor wires. Each kind must end with ``response.failed`` naming the malformed event, the
stream terminated, and the row stored failed; over JSON, WebSocket and background runs too. The
outermost guard is checked with one injected fault per streaming path.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import httpx
import pytest

from responses_app.models import Response, ResponseEvent
from tests.responses.conftest import Gateway, check_sdk_event, check_sdk_response, wait_terminal
from tests.responses.hostile import (
    CHAT_ANSWER_KINDS,
    CHAT_KINDS,
    HOSTILE_PARTS,
    RESPONSES_ANSWER_KINDS,
    RESPONSES_KINDS,
    answer,
)
from tests.responses.scripts import call, text
from tests.responses.test_failures import _assert_failed
from tests.responses.wsutil import Client, connect, create

CASES = [("responses", kind) for kind in RESPONSES_KINDS] + [
    ("chat_completions", kind) for kind in CHAT_KINDS
]
TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}]


def _kinds(wire: str) -> dict[str, Any]:
    return RESPONSES_KINDS if wire == "responses" else CHAT_KINDS


ANSWER_CASES = [("responses", kind) for kind in RESPONSES_ANSWER_KINDS] + [
    ("chat_completions", kind) for kind in CHAT_ANSWER_KINDS
]


def test_at_least_twenty_kinds_per_wire() -> None:
    assert len(RESPONSES_KINDS) >= 20 and len(CHAT_KINDS) >= 20
    assert len(RESPONSES_ANSWER_KINDS) >= 15 and len(CHAT_ANSWER_KINDS) >= 15


@pytest.mark.parametrize(("wire", "kind"), CASES)
def test_malformed_upstream_stream_ends_failed(gw: Gateway, wire: str, kind: str) -> None:
    gw.script(*HOSTILE_PARTS, mutate=_kinds(wire)[kind])
    final = _assert_failed(gw, gw.stream({"model": "m", "input": "x", "tools": TOOLS}), "malformed")
    assert final["error"]["code"] == "server_error"
    assert not [i for i in final["output"] if i.get("status") == "in_progress"]


SAMPLE = [
    ("responses", "item_done_item_is_number"),
    ("responses", "usage_input_tokens_is_string"),
    ("chat_completions", "delta_is_number"),
    ("chat_completions", "tool_calls_is_number"),
]


@pytest.mark.parametrize(("wire", "kind"), ANSWER_CASES)
def test_malformed_upstream_answer_ends_failed(gw: Gateway, wire: str, kind: str) -> None:
    """A JSON client's round asks the upstream for one answer; a malformed one fails the response."""
    kinds = RESPONSES_ANSWER_KINDS if wire == "responses" else CHAT_ANSWER_KINDS
    gw.script(*HOSTILE_PARTS, mutate_answer=kinds[kind])
    r = gw.post({"model": "m", "input": "x", "tools": TOOLS})
    assert r.status_code == 200, r.text  # the failed response object, as after any upstream failure
    assert gw.upstream_bodies()[-1]["stream"] is False
    body = r.json()
    check_sdk_response(body)
    assert body["status"] == "failed" and body["error"]["code"] == "server_error"
    assert "malformed" in body["error"]["message"]
    assert body["output"] == []
    row = Response.objects.get(id=body["id"])
    assert row.status == "failed" and row.snapshot == body
    assert not Response.objects.filter(status="completed").exists()


@pytest.mark.parametrize(
    ("wire", "kind", "member"),
    [
        ("responses", "output_item_is_number", "'output[0]': input should be a valid dictionary"),
        ("responses", "output_item_without_type", "'output[0].type' is missing"),
        (
            "chat_completions",
            "content_is_number",
            "'choices[0].message.content': input should be a valid string",
        ),
    ],
)
def test_a_malformed_answer_is_named_by_its_member(gw: Gateway, wire: str, kind: str, member: str) -> None:
    kinds = RESPONSES_ANSWER_KINDS if wire == "responses" else CHAT_ANSWER_KINDS
    gw.script(*HOSTILE_PARTS, mutate_answer=kinds[kind])
    body = gw.post({"model": "m", "input": "x", "tools": TOOLS}).json()
    assert body["error"]["message"] == f"The upstream sent a malformed answer: {member}."


@pytest.mark.parametrize(("wire", "kind"), SAMPLE)
def test_malformed_upstream_background(gw: Gateway, wire: str, kind: str) -> None:
    gw.script(*HOSTILE_PARTS, mutate=_kinds(wire)[kind])
    created = gw.post({"model": "m", "input": "x", "tools": TOOLS, "background": True}).json()
    row = wait_terminal(created["id"])
    assert row.status == "failed" and "malformed" in row.snapshot["error"]["message"]
    stored = [e.data for e in ResponseEvent.objects.filter(response_id=created["id"])]
    assert '"type":"response.failed"' in stored[-1]


@pytest.mark.parametrize(("wire", "kind"), SAMPLE)
def test_malformed_upstream_websocket(gw: Gateway, wire: str, kind: str) -> None:
    gw.script(*HOSTILE_PARTS, mutate=_kinds(wire)[kind])

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(input="x", tools=TOOLS))
            events = await c.until_terminal()
            await c.nothing_more(0.2)
            return events

    events = asyncio.run(scenario())
    assert events[-1]["type"] == "response.failed"
    assert "malformed" in events[-1]["response"]["error"]["message"]
    assert Response.objects.get(id=events[-1]["response"]["id"]).status == "failed"


# --- what a lenient upstream sends that is still well-formed -------------------------------------


@pytest.fixture
def wire() -> str:
    return "responses"


def _only_terminal(events: list[tuple[str, dict[str, Any]]]) -> None:
    """Keep ``response.created``, ``response.in_progress`` and ``response.completed`` only."""
    events[:] = [
        (k, d) for k, d in events if k in ("response.created", "response.in_progress", "response.completed")
    ]


def test_output_only_in_the_terminal_event_is_taken_from_there(gw: Gateway) -> None:
    gw.script(*HOSTILE_PARTS, mutate=_only_terminal)
    events = gw.stream({"model": "m", "input": "x", "tools": TOOLS})
    assert events[-1]["type"] == "response.completed"
    for event in events:
        check_sdk_event(event)
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["message", "function_call"]
    assert final["output"][0]["content"][0]["text"] == "Hello there"
    assert final["output"][1]["arguments"] == '{"q":"x"}'
    types = [e["type"] for e in events]
    assert types.count("response.output_item.done") == 2
    assert "response.output_text.delta" in types
    assert Response.objects.get(id=final["id"]).snapshot["output"] == final["output"]


def _odd_opening_members(events: list[tuple[str, dict[str, Any]]]) -> None:
    for kind, data in events:
        if kind in ("response.created", "response.in_progress"):
            data["response"].update(usage="lots", output=5, status=7)


def test_the_upstreams_opening_response_objects_are_not_read(gw: Gateway) -> None:
    """The gateway makes its own opening events: of the upstream's, only that ``response`` is an
    object is checked (the hostile kinds above), not members it never reads."""
    gw.script(*HOSTILE_PARTS, mutate=_odd_opening_members)
    events = gw.stream({"model": "m", "input": "x", "tools": TOOLS})
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed", final.get("error")
    assert final["output"][0]["content"][0]["text"] == "Hello there"
    assert [e["response"]["status"] for e in events[:2]] == ["in_progress", "in_progress"]
    assert Response.objects.get(id=final["id"]).status == "completed"


def _object_arguments(events: list[tuple[str, dict[str, Any]]]) -> None:
    events[:] = [(k, d) for k, d in events if k != "response.function_call_arguments.delta"]
    for kind, data in events:
        if kind == "response.output_item.done" and data["item"]["type"] == "function_call":
            data["item"]["arguments"] = {"q": "x", "n": 1}


def test_object_arguments_are_serialized_as_json_responses_wire(gw: Gateway) -> None:
    gw.script(*HOSTILE_PARTS, mutate=_object_arguments)
    final = gw.stream({"model": "m", "input": "x", "tools": TOOLS})[-1]["response"]
    assert final["status"] == "completed"
    assert final["output"][1]["arguments"] == '{"q":"x","n":1}'
    # The same in a JSON client's one answer.
    gw.script(*HOSTILE_PARTS, mutate_answer=answer(("output", 1, "arguments"), {"q": "x", "n": 1}))
    final = gw.post({"model": "m", "input": "x", "tools": TOOLS}).json()
    assert final["status"] == "completed"
    assert final["output"][1]["arguments"] == '{"q":"x","n":1}'


def _object_arguments_chat(chunks: list[dict[str, Any]]) -> None:
    for c in chunks:
        for tool_call in (c.get("choices") or [{}])[0].get("delta", {}).get("tool_calls") or ():
            if "arguments" in tool_call.get("function", {}):
                tool_call["function"]["arguments"] = {"q": "x", "n": 1}


@pytest.mark.parametrize("wire", ["chat_completions"])
def test_object_arguments_are_serialized_as_json_chat_wire(gw: Gateway) -> None:
    gw.script(text("Hi"), call("lookup", "ignored", call_id="call_c1"), mutate=_object_arguments_chat)
    final = gw.stream({"model": "m", "input": "x", "tools": TOOLS})[-1]["response"]
    assert final["status"] == "completed"
    assert final["output"][1]["arguments"] == '{"q":"x","n":1}'
    # The same in a JSON client's one answer.
    arguments = ("choices", 0, "message", "tool_calls", 0, "function", "arguments")
    gw.script(
        text("Hi"),
        call("lookup", "ignored", call_id="call_c1"),
        mutate_answer=answer(arguments, {"q": "x", "n": 1}),
    )
    final = gw.post({"model": "m", "input": "x", "tools": TOOLS}).json()
    assert final["status"] == "completed"
    assert final["output"][1]["arguments"] == '{"q":"x","n":1}'


# --- the outermost guard: an unexpected exception still ends the response failed ------------------


@pytest.fixture
def fault(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection: the tool loop's per-round hook raises, as a bug anywhere in a round would."""
    from responses_app.engine.tool_loop import ToolLoop

    def broken(self: Any) -> None:
        raise RuntimeError("injected fault")

    monkeypatch.setattr(ToolLoop, "start_round", broken)


def _guard_logged_once(caplog: pytest.LogCaptureFixture, rid: str) -> None:
    records = [r for r in caplog.records if r.name == "responses.executor" and rid in r.getMessage()]
    assert len(records) == 1, [r.getMessage() for r in records]
    assert records[0].exc_info is not None
    # The request id is in the message itself (a record's request_id attribute is set by the
    # handlers' filter, which another test's logging setup may have replaced).
    assert re.search(r"\(request req_[0-9a-f]+\)", records[0].getMessage()), records[0].getMessage()


def test_guard_sse_json_websocket_background(
    gw: Gateway, fault: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="responses.executor")
    gw.script(text("never sent"))
    events = gw.stream({"model": "m", "input": "x"})
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "response.failed"]
    final = events[-1]["response"]
    assert final["error"] == {
        "code": "server_error",
        "message": "The gateway failed while generating this response.",
    }
    assert Response.objects.get(id=final["id"]).status == "failed"
    _guard_logged_once(caplog, final["id"])

    body = gw.post({"model": "m", "input": "x"}).json()
    assert body["status"] == "failed"
    assert Response.objects.get(id=body["id"]).status == "failed"

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(input="x"))
            return await c.until_terminal()

    ws_events = asyncio.run(scenario())
    assert ws_events[-1]["type"] == "response.failed"
    assert Response.objects.get(id=ws_events[-1]["response"]["id"]).status == "failed"

    created = httpx.post(
        f"{gw.url}/v1/responses", json={"model": "m", "input": "x", "background": True}, timeout=30
    ).json()
    row = wait_terminal(created["id"])
    assert row.status == "failed"
    stored = [e.data for e in ResponseEvent.objects.filter(response_id=created["id"])]
    assert '"type":"response.failed"' in stored[-1]
    _guard_logged_once(caplog, created["id"])
