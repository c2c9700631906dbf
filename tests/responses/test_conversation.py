"""Responses with ``conversation``: history from the conversation, items appended, races refused."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web

from tests.responses.conftest import Gateway
from tests.responses.scripts import Script, handler, path_for, text
from tests.upstream import Gate, Recorded


def _held(inner: Any, gate: Gate) -> Any:
    """``inner``, answering only once ``gate`` is open."""

    async def answer(request: web.Request, rec: Recorded) -> web.StreamResponse:
        await gate.wait()
        return await inner(request, rec)

    return answer


def _conversation(gw: Gateway, items: list[dict[str, object]] | None = None) -> str:
    conv = gw.client.conversations.create(items=items or [])
    return conv.id


def test_response_with_conversation_uses_and_appends_items(gw: Gateway) -> None:
    conv_id = _conversation(gw, [{"type": "message", "role": "user", "content": "Earlier question"}])
    gw.script(text("First answer"))
    first = gw.client.responses.create(model="test-model", input="Second question", conversation=conv_id)
    assert first.output_text == "First answer"
    assert first.conversation is not None and first.conversation.id == conv_id
    raw = orjson.dumps(gw.upstream_bodies()[-1]).decode()
    assert "Earlier question" in raw and "Second question" in raw

    items = gw.client.conversations.items.list(conv_id, order="asc").data
    texts = [part.text for item in items for part in item.content]  # type: ignore[union-attr]
    assert texts == ["Earlier question", "Second question", "First answer"]
    assert items[-1].id == first.output[0].id

    gw.script(text("Second answer"))
    second = gw.client.responses.create(
        model="test-model",
        input=[{"type": "message", "role": "user", "content": "Third"}],
        conversation={"id": conv_id},
    )
    raw = orjson.dumps(gw.upstream_bodies()[-1]).decode()
    for earlier in ("Earlier question", "Second question", "First answer", "Third"):
        assert earlier in raw
    items = gw.client.conversations.items.list(conv_id, order="asc").data
    assert [i.id for i in items][-2:] == [items[-2].id, second.output[0].id]
    assert len(items) == 5


def test_conversation_and_previous_response_id_together_is_400(gw: Gateway) -> None:
    conv_id = _conversation(gw)
    r = gw.post({"model": "m", "input": "x", "conversation": conv_id, "previous_response_id": "resp_abc"})
    assert r.status_code == 400
    body = r.json()["error"]
    assert body["type"] == "invalid_request_error"
    assert (
        body["message"]
        == "Mutually exclusive parameters: Ensure you are only providing one of: 'previous_response_id' or 'conversation'."
    )
    assert gw.upstream_bodies() == []


@pytest.mark.parametrize("wire", ["responses"])
def test_concurrent_responses_on_one_conversation_do_not_interleave(gw: Gateway, wire: str) -> None:
    """Two responses racing on one conversation: one appends, the other gets 409 conversation_locked.

    On the default database (SQLite) as on PostgreSQL: both answers are held at the upstream until
    both requests reached it, so both read the same history before either appends."""
    conv_id = _conversation(gw)
    release = Gate()
    for answer in ("Answer A", "Answer B"):
        gw.upstream.script(path_for(wire), _held(handler(Script([text(answer)]), wire), release))
    results: dict[str, httpx.Response] = {}

    def run(name: str) -> None:
        results[name] = gw.post({"model": "test-model", "input": f"Question {name}", "conversation": conv_id})

    threads = [threading.Thread(target=run, args=(n,)) for n in ("A", "B")]
    seen = len(gw.upstream_bodies())
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(gw.upstream_bodies()) < seen + 2:  # both requests reached the upstream
        assert time.monotonic() < deadline, "the two requests never reached the upstream"
        time.sleep(0.01)
    release.open()
    for t in threads:
        t.join()
    statuses = sorted(r.status_code for r in results.values())
    assert statuses == [200, 409]
    loser = next(r for r in results.values() if r.status_code == 409)
    assert loser.json()["error"]["code"] == "conversation_locked"
    winner = next(r for r in results.values() if r.status_code == 200).json()
    items = gw.client.conversations.items.list(conv_id, order="asc").data
    assert len(items) == 2
    assert items[1].id == winner["output"][0]["id"]
    question = items[0].content[0].text  # type: ignore[union-attr]
    assert question in ("Question A", "Question B")
    answer = items[1].content[0].text  # type: ignore[union-attr]
    assert answer in ("Answer A", "Answer B")
