"""Failure paths: never a fake ``response.completed``; stored as failed when ``store``."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from responses_app.models import Response
from tests.responses.conftest import Gateway, check_sdk_event
from tests.responses.scripts import text


def _assert_failed(gw: Gateway, events: list[dict[str, Any]], needle: str) -> dict[str, Any]:
    types = [e["type"] for e in events]
    assert "response.completed" not in types
    assert types[-1] == "response.failed", types
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        check_sdk_event(event)
    final = events[-1]["response"]
    assert final["status"] == "failed"
    assert needle in final["error"]["message"]
    row = Response.objects.get(id=final["id"])
    assert row.status == "failed"
    assert row.snapshot == final
    assert not Response.objects.filter(status="completed").exists()
    return dict(final)


def test_truncated_stream_fails(gw: Gateway) -> None:
    gw.script(text("Hello", " world", " again"), truncate_after=5)
    final = _assert_failed(
        gw, gw.stream({"model": "m", "input": "x"}), "ended before the response was complete"
    )
    assert final["error"]["code"] == "server_error"


def test_malformed_chunk_fails(gw: Gateway) -> None:
    gw.script(text("Hello", " world"), malformed_at=3)
    _assert_failed(gw, gw.stream({"model": "m", "input": "x"}), "malformed")


def test_oversize_sse_line_fails(gw: Gateway, gateway_config: Any) -> None:
    gateway_config(
        llm_api_base=gw.upstream.url, upstream_api=gw.wire, responses__max_upstream_sse_line_bytes=4096
    )
    gw.script(text("Hello"), oversize_line=10_000)
    _assert_failed(gw, gw.stream({"model": "m", "input": "x"}), "max_upstream_sse_line_bytes (4096 bytes)")


def test_upstream_5xx_fails_streaming_and_json(gw: Gateway) -> None:
    gw.script(error_status=500, error_message="engine died")
    _assert_failed(gw, gw.stream({"model": "m", "input": "x"}), "engine died")
    gw.script(error_status=500, error_message="engine died again")
    r = gw.post({"model": "m", "input": "x"})
    assert r.status_code == 200  # the same final object the stream ended with
    assert r.json()["status"] == "failed"
    assert r.json()["error"]["message"] == "engine died again"


def test_upstream_4xx_is_relayed_for_json_and_stored_failed(gw: Gateway) -> None:
    gw.script(error_status=400, error_message="This model's maximum context length is 4096 tokens.")
    r = gw.post({"model": "m", "input": "x"})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "This model's maximum context length is 4096 tokens."
    row = Response.objects.get()
    assert row.status == "failed"
    assert row.snapshot["error"]["code"] == "invalid_prompt"


def test_unreachable_upstream_fails(gw: Gateway, gateway_config: Any) -> None:
    gateway_config(llm_api_base="http://127.0.0.1:9", upstream_api=gw.wire)
    _assert_failed(gw, gw.stream({"model": "m", "input": "x"}), "Could not reach the upstream")


def test_max_retained_bytes(gw: Gateway, gateway_config: Any) -> None:
    gateway_config(llm_api_base=gw.upstream.url, upstream_api=gw.wire, responses__max_retained_bytes=64)
    gw.script(text("x" * 40, "y" * 40))
    _assert_failed(gw, gw.stream({"model": "m", "input": "x"}), "max_retained_bytes (64 bytes)")


def test_max_stream_event_bytes(gw: Gateway, gateway_config: Any) -> None:
    gateway_config(llm_api_base=gw.upstream.url, upstream_api=gw.wire, responses__max_stream_event_bytes=1500)
    gw.script(text("a" * 400, "b" * 400))
    events = gw.stream({"model": "m", "input": "x"})
    types = [e["type"] for e in events]
    assert "response.completed" not in types
    assert types[-1] == "error"
    assert events[-1]["code"] == "event_too_large"
    assert "max_stream_event_bytes (1500 bytes)" in events[-1]["message"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    check_sdk_event(events[-1])
    assert Response.objects.get().status == "failed"


def test_max_stream_event_bytes_does_not_bound_a_json_answer(gw: Gateway, gateway_config: Any) -> None:
    """A JSON client receives no events (its answer is the response object), so the limit on an
    outbound event does not apply: the same response that fails as a stream above completes."""
    gateway_config(llm_api_base=gw.upstream.url, upstream_api=gw.wire, responses__max_stream_event_bytes=1500)
    gw.script(text("a" * 400, "b" * 400))
    r = gw.post({"model": "m", "input": "x"})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["status"] == "completed"
    assert answer["output"][0]["content"][0]["text"] == "a" * 400 + "b" * 400
    assert Response.objects.get(id=answer["id"]).status == "completed"


def test_an_unread_event_is_numbered_and_serialized_only_when_asked() -> None:
    from gateway.core.sse import EventSink

    sink = EventSink(10)  # smaller than any event: an unread one is not size-checked
    sink.unread = True
    first = sink.make("response.created", response={"id": "r"})
    second = sink.make("response.in_progress", response={"id": "r"})
    assert (first.data["sequence_number"], second.data["sequence_number"]) == (0, 1)
    assert second.frame == (
        b'event: response.in_progress\ndata: {"type":"response.in_progress","response":{"id":"r"},'
        b'"sequence_number":1}\n\n'
    )
    assert second.json == b'{"type":"response.in_progress","response":{"id":"r"},"sequence_number":1}'


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL refuses \\u0000 in JSON text")
def test_snapshot_write_failure_is_an_error_event(gw: Gateway) -> None:
    # Client strings with U+0000 are refused up front (test_hostile_input); an upstream's are not.
    gw.script(text("bad\u0000value"))
    events = gw.stream({"model": "m", "input": "x"})
    types = [e["type"] for e in events]
    assert "response.completed" not in types
    assert types[-1] == "error"
    assert events[-1]["code"] == "storage_error"
    # Its id was announced: the row written before response.created ends failed, never completed.
    row = Response.objects.get(id=events[0]["response"]["id"])
    assert row.status == "failed" and row.lease_expires_at is None
    assert row.error == {"code": "server_error", "message": "The response could not be stored: DataError."}
    assert row.snapshot["status"] == "failed" and row.snapshot["output"] == []
    assert Response.objects.count() == 1
