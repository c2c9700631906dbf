"""Background mode (in-process runner, no broker): create, poll, stream/replay, cancel."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest

from responses_app.models import Response, ResponseEvent
from tests.responses.conftest import Gateway, check_sdk_event, sse_events
from tests.responses.scripts import Script, handler, path_for, text


@pytest.fixture
def wire() -> str:
    return "responses"


def _wait_status(gw: Gateway, rid: str, wanted: set[str], timeout: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = httpx.get(f"{gw.url}/v1/responses/{rid}").json()
        if body["status"] in wanted:
            return dict(body)
        time.sleep(0.05)
    raise AssertionError(f"{rid} never reached {wanted}")


def _held(gw: Gateway, script: Script, release: threading.Event) -> None:
    """Answer with ``script`` only once ``release`` is set (at the latest after 20 s)."""
    inner = handler(script, "responses")
    deadline = time.monotonic() + 20

    async def held(request: Any, rec: Any) -> Any:
        while not release.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return await inner(request, rec)

    gw.upstream.script(path_for("responses"), held)


def test_background_create_poll_and_replay(gw: Gateway) -> None:
    release = threading.Event()
    _held(gw, Script([text("Hello", " from", " the", " background")]), release)
    # Answered while the upstream still holds the model's answer: the create does not wait for it.
    created = gw.client.responses.create(model="m", input="x", background=True)
    assert created.status == "queued"
    release.set()
    assert created.background is True
    final = _wait_status(gw, created.id, {"completed"})
    assert final["output"][0]["content"][0]["text"] == "Hello from the background"
    # Replay every stored event with the SDK, then only those after N.
    with gw.client.responses.retrieve(created.id, stream=True) as stream:
        events = list(stream)
    types = [e.type for e in events]
    assert types[0] == "response.created"
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output_text == "Hello from the background"
    with gw.client.responses.retrieve(created.id, stream=True, starting_after=5) as stream:
        later = list(stream)
    assert [e.sequence_number for e in later] == list(range(6, len(events)))
    stored = [
        e.data for e in ResponseEvent.objects.filter(response_id=created.id).order_by("sequence_number")
    ]
    assert len(stored) == len(events)


def test_background_stream_tails_a_running_response(gw: Gateway) -> None:
    gw.script(text(*[f"w{i} " for i in range(10)]), delay_s=0.05)
    events = sse_events(
        httpx.post(
            f"{gw.url}/v1/responses",
            json={"model": "m", "input": "x", "background": True, "stream": True},
            timeout=30,
        )
    )
    assert events[0]["type"] == "response.created"
    assert events[0]["response"]["status"] == "queued"
    assert events[-1]["type"] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        check_sdk_event(event)
    rid = events[-1]["response"]["id"]
    # A second client attaches to the finished stream from the middle.
    tail = sse_events(
        httpx.get(f"{gw.url}/v1/responses/{rid}", params={"stream": "true", "starting_after": 10})
    )
    assert [e["sequence_number"] for e in tail] == list(range(11, len(events)))


def test_background_cancel(gw: Gateway) -> None:
    gw.script(text(*[f"w{i} " for i in range(200)]), delay_s=0.05)
    created = gw.client.responses.create(model="m", input="x", background=True)
    _wait_status(gw, created.id, {"in_progress"})
    deadline = time.monotonic() + 10  # until the model's text is streaming
    while not ResponseEvent.objects.filter(
        response_id=created.id, data__contains="output_text.delta"
    ).exists():
        assert time.monotonic() < deadline, "the background response never streamed"
        time.sleep(0.02)
    cancelled = gw.client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    row = Response.objects.get(id=created.id)
    assert row.status == "cancelled"
    assert gw.client.responses.retrieve(created.id).status == "cancelled"
    # The work stopped: the gateway closed its upstream request, and nothing was recorded after.
    assert gw.upstream.wait_disconnected(gw.upstream.last(path_for("responses")))
    assert ResponseEvent.objects.filter(response_id=created.id).count() < 200  # not all 200 words
    assert not ResponseEvent.objects.filter(
        response_id=created.id, data__contains="response.completed"
    ).exists()
    again = httpx.post(f"{gw.url}/v1/responses/{created.id}/cancel")
    assert again.status_code == 200
    assert again.json()["status"] == "cancelled"


def test_cancel_refusals(gw: Gateway) -> None:
    gw.script(text("x"))
    fg = gw.post({"model": "m", "input": "x"}).json()
    r = httpx.post(f"{gw.url}/v1/responses/{fg['id']}/cancel")
    assert r.status_code == 400
    assert "background" in r.json()["error"]["message"]
    gw.script(text("done"))
    bg = gw.client.responses.create(model="m", input="x", background=True)
    _wait_status(gw, bg.id, {"completed"})
    r = httpx.post(f"{gw.url}/v1/responses/{bg.id}/cancel")
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "Cannot cancel a completed response."
    assert httpx.post(f"{gw.url}/v1/responses/resp_nope/cancel").status_code == 404


def test_background_chain_continues(gw: Gateway) -> None:
    gw.script(text("first"))
    bg = gw.client.responses.create(model="m", input="one", background=True)
    _wait_status(gw, bg.id, {"completed"})
    gw.script(text("second"))
    follow = gw.client.responses.create(model="m", input="two", previous_response_id=bg.id)
    assert follow.output_text == "second"
    sent = gw.upstream_bodies()[-1]
    assert [i["content"][0]["text"] for i in sent["input"]] == ["one", "first", "two"]
