"""The usage ledger on the Responses API (docs/responses.md, "Usage ledger"): one row per upstream call.

Every executor round (tool rounds included), every compaction summary, every multi-agent agent's round,
``POST /v1/responses/compact``, the direct path, WebSocket and background responses. A stored
response's rows are written in its own final write (never through the batch writer, so they exist as
soon as the response is retrievable); every other row goes through the batch writer, once. Both
upstream wires, against the scripted upstream.
"""

# ruff: noqa: F811  (the Responses fixtures, imported by name, are test parameters)
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest

from gateway.core.auth import apikeys
from responses_app.models import Response, ResponseEvent
from tests.responses.conftest import Gateway, gw, wait_terminal, wire  # noqa: F401  (fixtures)
from tests.responses.scripts import call, path_for, text
from tests.responses.test_background_celery import broker  # noqa: F401  (a fixture)
from tests.responses.test_multi_agent import route, two_subagents
from tests.responses.wsutil import Client, connect, create
from usage_app import ledger, writer
from usage_app.models import UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)

ROUTE = "/v1/responses"


def usage(input_tokens: int, output_tokens: int, cached: int = 0, reasoning: int = 0) -> dict[str, Any]:
    """A script's usage with every counter the ledger reads (both wires report the same then)."""
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
        "cached_tokens": cached,
        "reasoning_tokens": reasoning,
    }


def tokens(row: UsageRecord) -> tuple[Any, ...]:
    return row.input_tokens, row.output_tokens, row.cached_tokens, row.reasoning_tokens


def rows_of(response_id: str) -> list[UsageRecord]:
    return list(UsageRecord.objects.filter(response_id=response_id).order_by("created_at", "id"))


def wait_rows(count: int, timeout: float = 10.0, **filters: Any) -> list[UsageRecord]:
    """The ledger rows matching ``filters`` once there are ``count`` (the batch writer flushed)."""
    deadline = time.monotonic() + timeout
    while True:
        asyncio.run(writer.flush())
        found = list(UsageRecord.objects.filter(**filters).order_by("created_at", "id"))
        if len(found) >= count or time.monotonic() > deadline:
            assert len(found) == count, found
            return found
        time.sleep(0.05)


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The entries handed to the batch writer (a stored response's rows never are)."""
    entries: list[Any] = []
    original = writer.queue

    def spy(entry: Any) -> None:
        entries.append(entry)
        original(entry)

    monkeypatch.setattr(writer, "queue", spy)
    yield entries


def check_row(row: UsageRecord, response_id: str, *, status: int = 200, route: str = ROUTE) -> None:
    assert row.route == route and row.kind == "completions"
    assert row.model == "m" and row.response_id == response_id
    assert row.owner == "default" and row.api_key_id is None
    assert row.status == status and row.latency_ms >= 0
    assert row.request_id


# --- stored responses: the rows are part of the response's final write ---------------------------


def test_a_stored_json_response_writes_its_row_with_the_response(gw: Gateway, queued: list[Any]) -> None:
    apikeys.apikey_create(name="ledger")
    key, secret = apikeys.apikey_create(name="caller")
    apikeys.reset()
    gw.script(text("Hello"), usage=usage(30, 5, cached=8, reasoning=2))
    r = gw.post({"model": "m", "input": "hi"}, headers={"authorization": f"Bearer {secret}"})
    assert r.status_code == 200, r.text
    body = r.json()
    # There as soon as the answer is: the response's own write, not the batch writer.
    (row,) = rows_of(body["id"])
    assert queued == []
    assert (row.owner, row.api_key_id) == (f"key:{key.id}", key.id)
    assert row.request_id == r.headers["x-request-id"]
    assert tokens(row) == (30, 5, 8, 2)
    assert (row.route, row.kind, row.model, row.status) == (ROUTE, "completions", "m", 200)
    assert row.created_at <= Response.objects.get(id=body["id"]).completed_at
    apikeys.reset()


def test_a_stored_stream_writes_its_row_with_the_response(gw: Gateway, queued: list[Any]) -> None:
    gw.script(text("Hel", "lo"), usage=usage(21, 4, cached=3, reasoning=1))
    events = gw.stream({"model": "m", "input": "hi"})
    response_id = events[-1]["response"]["id"]
    (row,) = rows_of(response_id)
    check_row(row, response_id)
    assert tokens(row) == (21, 4, 3, 1)
    assert queued == []


def test_a_tool_loop_has_a_row_per_round(gw: Gateway, queued: list[Any]) -> None:
    lookup = {"type": "function", "name": "lookup", "parameters": {"type": "object"}, "async": True}
    gw.script(call("lookup", "{}", call_id="call_a"), usage=usage(40, 6, cached=0, reasoning=3))
    gw.script(text("Later."), usage=usage(55, 2, cached=40, reasoning=0))
    r = gw.post({"model": "m", "input": "go", "tools": [lookup]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(gw.upstream_bodies()) == 2
    first, second = rows_of(body["id"])
    check_row(first, body["id"])
    check_row(second, body["id"])
    assert [tokens(first), tokens(second)] == [(40, 6, 0, 3), (55, 2, 40, 0)]
    assert body["usage"]["input_tokens"] == first.input_tokens + second.input_tokens  # type: ignore[operator]
    assert queued == []


def test_a_compaction_trigger_summary_round_has_its_row(gw: Gateway, queued: list[Any]) -> None:
    gw.script(text("Summary."), usage=usage(300, 20, cached=100, reasoning=0))
    history = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    r = gw.post({"model": "m", "input": [*history, {"type": "compaction_trigger"}]})
    assert r.status_code == 200, r.text
    (row,) = rows_of(r.json()["id"])
    check_row(row, r.json()["id"])
    assert tokens(row) == (300, 20, 100, 0)
    assert queued == []


def test_automatic_compaction_has_a_row_for_the_summary_and_one_for_the_round(
    gw: Gateway, queued: list[Any]
) -> None:
    gw.script(text("Summary."), usage=usage(300, 20, cached=0, reasoning=0))
    gw.script(text("answer"), usage=usage(50, 5, cached=10, reasoning=1))
    history = [
        {"role": "user", "content": "A" * 400},
        {"role": "assistant", "content": "B" * 400},
        {"role": "user", "content": "C"},
    ]
    events = gw.stream(
        {
            "model": "m",
            "input": history,
            "context_management": [{"type": "compaction", "compact_threshold": 1}],
        }
    )
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["compaction", "message"]
    summary, answer = rows_of(final["id"])
    assert [tokens(summary), tokens(answer)] == [(300, 20, 0, 0), (50, 5, 10, 1)]
    assert queued == []


def test_compact_endpoint_writes_its_row_with_the_checkpoint(gw: Gateway, queued: list[Any]) -> None:
    gw.script(text("Summary."), usage=usage(90, 12, cached=30, reasoning=4))
    r = httpx.post(
        f"{gw.url}/v1/responses/compact",
        json={"model": "m", "input": [{"role": "user", "content": "hello"}]},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    (row,) = rows_of(r.json()["id"])
    check_row(row, r.json()["id"], route="/v1/responses/compact")
    assert tokens(row) == (90, 12, 30, 4)
    assert row.request_id == r.headers["x-request-id"]
    assert queued == []


def test_a_multi_agent_response_has_a_row_for_each_agent_round(gw: Gateway, queued: list[Any]) -> None:
    route(gw, two_subagents, 8)
    r = gw.post({"model": "m", "input": "do two things", "multi_agent": {"enabled": True}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "completed"
    calls = len(gw.upstream_bodies())
    assert calls >= 4  # the root's rounds and each subagent's
    rows = rows_of(body["id"])
    assert len(rows) == calls
    # The scripts' default usage: no cached or reasoning counters on the chat wire, zeros from vLLM's
    # /v1/responses.
    unreported = None if gw.wire == "chat_completions" else 0
    for row in rows:
        check_row(row, body["id"])
        assert tokens(row) == (12, 7, unreported, unreported)
    assert body["usage"]["input_tokens"] == 12 * calls
    assert queued == []


def test_a_websocket_response_writes_its_row_with_the_response(gw: Gateway, queued: list[Any]) -> None:
    gw.script(text("over the socket"), usage=usage(17, 3, cached=5, reasoning=0))

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(gw.url) as ws:
            client = Client(ws)
            await client.send(create(model="m"))
            return await client.until_terminal()

    events = asyncio.run(scenario())
    final = events[-1]["response"]
    assert final["status"] == "completed"
    (row,) = rows_of(final["id"])
    check_row(row, final["id"])
    assert tokens(row) == (17, 3, 5, 0)
    assert queued == []


def test_a_background_response_writes_its_row_with_the_response(gw: Gateway, queued: list[Any]) -> None:
    gw.script(text("later"), usage=usage(11, 9, cached=1, reasoning=2))
    r = gw.post({"model": "m", "input": "x", "background": True})
    assert r.status_code == 200, r.text
    created = r.json()
    assert wait_terminal(created["id"]).status == "completed"
    (row,) = rows_of(created["id"])
    check_row(row, created["id"])
    assert row.request_id == r.headers["x-request-id"]  # the creating request's, not the task's
    assert tokens(row) == (11, 9, 1, 2)
    assert queued == []


# --- failures -----------------------------------------------------------------------------------


def test_an_upstream_failure_is_a_502_row_and_the_response_failed(gw: Gateway, queued: list[Any]) -> None:
    gw.script(text("cut", " short"), truncate_after=3)  # the stream ends without its terminal event
    events = gw.stream({"model": "m", "input": "x"})
    assert events[-1]["type"] == "response.failed"
    response_id = events[-1]["response"]["id"]
    assert Response.objects.get(id=response_id).status == "failed"
    (row,) = rows_of(response_id)
    check_row(row, response_id, status=502)
    assert tokens(row) == (None, None, None, None)
    assert queued == []


def test_an_upstream_refusal_is_a_row_with_its_status(gw: Gateway, queued: list[Any]) -> None:
    gw.script(text("no"), error_status=500)
    events = gw.stream({"model": "m", "input": "x"})
    response_id = events[-1]["response"]["id"]
    assert events[-1]["type"] == "response.failed"
    (row,) = rows_of(response_id)
    check_row(row, response_id, status=500)
    assert queued == []


def test_an_unreachable_upstream_is_a_502_row(
    gw: Gateway, gateway_config: Callable[..., Any], queued: list[Any]
) -> None:
    gateway_config(llm_api_base="http://127.0.0.1:9")
    events = gw.stream({"model": "m", "input": "x"})
    response_id = events[-1]["response"]["id"]
    assert events[-1]["type"] == "response.failed"
    (row,) = rows_of(response_id)
    check_row(row, response_id, status=502)


@pytest.mark.parametrize("wire", ["responses"])
def test_a_background_response_on_a_celery_worker_keeps_the_creating_principal(
    gw: Gateway, broker: None, queued: list[Any]
) -> None:
    key, secret = apikeys.apikey_create(name="worker-caller")
    apikeys.reset()
    gw.script(text("from a worker"), usage=usage(13, 4, cached=2, reasoning=1))
    r = gw.post(
        {"model": "m", "input": "x", "background": True}, headers={"authorization": f"Bearer {secret}"}
    )
    assert r.status_code == 200, r.text
    response_id = r.json()["id"]
    assert wait_terminal(response_id, timeout=20).status == "completed"
    (row,) = rows_of(response_id)
    assert (row.owner, row.api_key_id) == (f"key:{key.id}", key.id)
    assert row.request_id == r.headers["x-request-id"]  # sent with the task
    assert tokens(row) == (13, 4, 2, 1)
    assert queued == []
    apikeys.reset()


def test_a_cancelled_background_response_has_a_499_row_written_once(gw: Gateway, queued: list[Any]) -> None:
    gw.script(text(*[f"w{i} " for i in range(200)]), delay_s=0.05)
    created = gw.client.responses.create(model="m", input="x", background=True)
    deadline = time.monotonic() + 10  # until the model's text is streaming
    while not ResponseEvent.objects.filter(
        response_id=created.id, data__contains="output_text.delta"
    ).exists():
        assert time.monotonic() < deadline, "the background response never streamed"
        time.sleep(0.02)
    assert gw.client.responses.cancel(created.id).status == "cancelled"
    # Its run ended without a final write: the round's row goes to the batch writer.
    (row,) = wait_rows(1, response_id=created.id)
    check_row(row, created.id, status=499)
    assert tokens(row) == (None, None, None, None)
    assert [e.response_id for e in queued] == [created.id]


def test_a_count_no_column_holds_is_null_and_the_response_is_still_stored(gw: Gateway) -> None:
    gw.script(text("big"), usage=usage(2**63, 5, cached=0, reasoning=0))
    r = gw.post({"model": "m", "input": "x"})
    assert r.status_code == 200, r.text
    assert Response.objects.get(id=r.json()["id"]).status == "completed"
    (row,) = rows_of(r.json()["id"])
    assert tokens(row) == (None, 5, 0, 0)


# --- unstored responses: the batch writer ----------------------------------------------------------


def test_an_unstored_response_is_written_by_the_batch_writer(gw: Gateway, queued: list[Any]) -> None:
    gw.script(text("not kept"), usage=usage(14, 6, cached=2, reasoning=0))
    # context_management keeps it on the executor on both wires (the direct path is tested below).
    r = gw.post({"model": "m", "input": "x", "store": False, "context_management": [{"type": "compaction"}]})
    assert r.status_code == 200, r.text
    response_id = r.json()["id"]
    assert not Response.objects.filter(id=response_id).exists()
    (row,) = wait_rows(1, response_id=response_id)
    check_row(row, response_id)
    assert tokens(row) == (14, 6, 2, 0)
    assert [e.response_id for e in queued] == [response_id]  # once


def test_a_client_that_leaves_an_unstored_stream_is_a_499_row(gw: Gateway, queued: list[Any]) -> None:
    gw.script(text(*["word "] * 200), delay_s=0.05)
    body = {
        "model": "m",
        "input": "hi",
        "stream": True,
        "store": False,
        "context_management": [{"type": "compaction"}],
    }
    with httpx.stream("POST", f"{gw.url}/v1/responses", json=body, timeout=30) as r:
        assert r.status_code == 200
        seen = b""
        for chunk in r.iter_raw():  # until the upstream is streaming to us
            seen += chunk
            if b"response.output_text.delta" in seen:
                break
    response_id = seen.split(b'"id":"', 1)[1].split(b'"', 1)[0].decode()
    assert gw.upstream.wait_disconnected(gw.upstream.last(path_for(gw.wire)))
    (row,) = wait_rows(1, response_id=response_id)
    check_row(row, response_id, status=499)
    assert tokens(row) == (None, None, None, None)
    assert len(queued) == 1


@pytest.mark.parametrize("wire", ["responses"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("length", [6, 2 * 1024 * 1024])  # past UsageTap's own line and body limits
def test_the_direct_path_is_recorded_from_the_relayed_answer(
    gw: Gateway, stream: bool, length: int, queued: list[Any]
) -> None:
    """Read up to ``max_upstream_sse_line_bytes``: a long answer's terminal event, or JSON body."""
    gw.script(text("d" * length), usage=usage(19, 8, cached=4, reasoning=2))
    body = {"model": "m", "input": "x", "store": False, "stream": stream}
    r = httpx.post(f"{gw.url}/v1/responses", json=body, timeout=30)
    assert r.status_code == 200, r.text
    if stream:
        terminal = r.text.rstrip().rsplit("\n\n", 1)[-1]
        assert terminal.startswith("event: response.completed")
        upstream_id = terminal.split('"id":"', 1)[1].split('"', 1)[0]
    else:
        upstream_id = r.json()["id"]
    assert Response.objects.count() == 0  # relayed, not ours
    (row,) = wait_rows(1, route=ROUTE)
    check_row(row, upstream_id)
    assert tokens(row) == (19, 8, 4, 2)
    assert row.request_id == r.headers["x-request-id"]
    assert len(queued) == 1


@pytest.mark.parametrize("wire", ["responses"])
@pytest.mark.parametrize("stream", [False, True])
def test_the_direct_path_nulls_a_count_no_column_holds(gw: Gateway, stream: bool) -> None:
    gw.script(text("big"), usage=usage(2**63, 5, cached=0, reasoning=0))
    body = {"model": "m", "input": "x", "store": False, "stream": stream}
    assert httpx.post(f"{gw.url}/v1/responses", json=body, timeout=30).status_code == 200
    (row,) = wait_rows(1, route=ROUTE)
    assert row.status == 200 and row.response_id
    assert tokens(row) == (None, 5, 0, 0)


@pytest.mark.parametrize("wire", ["responses"])
def test_a_client_that_leaves_the_direct_path_after_the_terminal_event_is_not_a_499(gw: Gateway) -> None:
    """The whole answer passed (its terminal event relayed): the row is the upstream's 200 with its
    usage, though the stream had not closed when the client left."""

    def linger(events: list[Any]) -> None:  # the upstream's stream goes on after the terminal event
        events.extend(("response.keepalive", {"type": "response.keepalive"}) for _ in range(60))

    gw.script(text("done"), usage=usage(7, 3), delay_s=0.05, mutate=linger)
    body = {"model": "m", "input": "x", "store": False, "stream": True}
    with httpx.stream("POST", f"{gw.url}/v1/responses", json=body, timeout=30) as r:
        seen = b""
        for chunk in r.iter_raw():
            seen += chunk
            if b"event: response.completed" in seen and seen.endswith(b"\n\n"):
                break
    assert gw.upstream.wait_disconnected(gw.upstream.last(path_for(gw.wire)))
    (row,) = wait_rows(1, route=ROUTE)
    assert row.status == 200 and row.response_id
    assert tokens(row) == (7, 3, 0, 0)


@pytest.mark.parametrize("wire", ["responses"])
def test_the_direct_path_to_an_unreachable_upstream_is_a_502_row(
    gw: Gateway, gateway_config: Callable[..., Any], queued: list[Any]
) -> None:
    gateway_config(llm_api_base="http://127.0.0.1:9")
    r = httpx.post(f"{gw.url}/v1/responses", json={"model": "m", "input": "x", "store": False}, timeout=30)
    assert r.status_code == 502, r.text
    (row,) = wait_rows(1, route=ROUTE)
    check_row(row, "", status=502)
    assert tokens(row) == (None, None, None, None)


# --- the final write itself -------------------------------------------------------------------------


def _prepared(text_input: str) -> Any:
    from gateway.core.config import get_config
    from gateway.core.principal import Principal
    from responses_app.protocol.schemas import parse_create_request
    from responses_app.storage import prepare

    request, raw = parse_create_request(orjson.dumps({"model": "m", "input": text_input}))
    return prepare.response_prepare(
        request=request,
        raw=raw,
        owner="key:7",
        headers={},
        config=get_config(),
        principal=Principal(owner="key:7", kind="api_key", api_key_id=7),
        request_id="req_final_write",
    )


def _entry(p: Any, input_tokens: int) -> Any:
    return ledger.UsageEntry(
        principal=p.principal,
        route=ROUTE,
        model="m",
        status=200,
        started_at=time.time(),
        latency_ms=5,
        input_tokens=input_tokens,
        output_tokens=1,
        response_id=p.response_id,
        request_id=p.request_id,
    )


def _outcome(p: Any, *entries: Any) -> Any:
    from responses_app.storage import writes

    return writes.Outcome("completed", {"id": p.response_id}, [], usage_entries=list(entries))


def test_the_final_write_stores_the_rows_in_its_transaction_or_queues_them_once(queued: list[Any]) -> None:
    from django.db import transaction

    from responses_app.storage import writes

    # Stored: the rows are inserted by the response's write (a batch of two responses, one statement
    # on PostgreSQL).
    one, two = _prepared("one"), _prepared("two")
    assert writes.response_store_rows(
        [
            writes.FinalWrite(one, _outcome(one, _entry(one, 3), _entry(one, 4))),
            writes.FinalWrite(two, _outcome(two, _entry(two, 5))),
        ]
    ) == [True, True]
    assert [(r.input_tokens, r.owner, r.api_key_id, r.request_id) for r in rows_of(one.response_id)] == [
        (3, "key:7", 7, "req_final_write"),
        (4, "key:7", 7, "req_final_write"),
    ]
    assert [r.input_tokens for r in rows_of(two.response_id)] == [5]
    assert queued == []
    # Rolled back with the response: neither is written, nothing is queued.
    three = _prepared("three")
    with pytest.raises(RuntimeError), transaction.atomic():
        assert writes.response_store_final(prepared=three, outcome=_outcome(three, _entry(three, 6)))
        raise RuntimeError("the batch fails after the write")
    assert not Response.objects.filter(id=three.response_id).exists()
    assert rows_of(three.response_id) == [] and queued == []
    # Not stored (cancelled meanwhile): the rows go to the batch writer once the write commits.
    four = _prepared("four")
    writes.response_create_in_progress(prepared=four, snapshot={}, lease_owner="x", lease_s=60)
    Response.objects.filter(id=four.response_id).update(status="cancelled")
    assert writes.response_store_rows([writes.FinalWrite(four, _outcome(four, _entry(four, 8)))]) == [False]
    assert rows_of(four.response_id) == []
    assert [e.input_tokens for e in queued] == [8]
    (row,) = wait_rows(1, response_id=four.response_id)
    assert row.input_tokens == 8
