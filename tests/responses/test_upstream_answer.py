"""A JSON client's rounds ask the upstream for one answer (``"stream": false``), as the reference
gateway does; a streaming client's rounds stream. Both read through the same parser and emitter,
so the response a JSON client gets is the one a streaming client's terminal event carries.

On both executor wires: the same output for text, reasoning, client calls, an incomplete answer,
the served tier and usage; the faults of a whole answer (cut short, over the size limit, an error
status) end ``failed`` and stored; an upstream that streams anyway is read as a stream.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from responses_app.models import Response
from tests.responses.conftest import Gateway, check_sdk_response, wait_terminal
from tests.responses.scripts import Part, call, reasoning, text

TOOLS = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}]

SCRIPTS: dict[str, tuple[list[Part], dict[str, Any]]] = {
    "text": ([text("Hello", " there", "!")], {}),
    "reasoning_then_text": ([reasoning("Let me", " think"), text("Done.")], {}),
    "text_then_call": ([text("Looking"), call("lookup", '{"q":', '"x"}', call_id="call_a1")], {}),
    "two_calls": (
        [call("lookup", '{"q":"a"}', call_id="call_b1"), call("lookup", '{"q":"b"}', call_id="call_b2")],
        {},
    ),
    "incomplete": ([text("cut")], {"status": "incomplete"}),
    "tier_and_cache": (
        [text("ok")],
        {
            "service_tier": "flex",
            "usage": {"input_tokens": 20, "output_tokens": 3, "total_tokens": 23, "cached_tokens": 8},
        },
    ),
}


def _comparable(response: dict[str, Any]) -> dict[str, Any]:
    """What must match between the two clients: everything but ids and times."""
    drop = {"id", "created_at", "completed_at"}
    out = {k: v for k, v in response.items() if k not in drop}
    out["output"] = [{k: v for k, v in item.items() if k != "id"} for item in response["output"]]
    return out


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_json_client_gets_what_the_stream_ends_with(gw: Gateway, name: str) -> None:
    parts, options = SCRIPTS[name]
    request = {"model": "m", "input": "x", "tools": TOOLS}
    gw.script(*parts, **options)
    streamed = gw.stream(request)[-1]["response"]
    gw.script(*parts, **options)
    r = gw.post(request)
    assert r.status_code == 200, r.text
    answered = r.json()
    check_sdk_response(answered)
    assert _comparable(answered) == _comparable(streamed)
    assert answered["status"] == ("incomplete" if name == "incomplete" else "completed")

    stream_round, answer_round = gw.upstream_bodies()
    assert stream_round["stream"] is True and answer_round["stream"] is False
    if gw.wire == "chat_completions":  # vLLM refuses stream_options on a request that does not stream
        assert stream_round["stream_options"] == {"include_usage": True}
        assert "stream_options" not in answer_round
    row = Response.objects.get(id=answered["id"])
    assert row.status == answered["status"] and row.snapshot == answered


def test_a_background_response_still_streams(gw: Gateway) -> None:
    """Its events are stored for a client that reads them later: its rounds stream."""
    gw.script(text("later"))
    created = gw.post({"model": "m", "input": "x", "background": True}).json()
    row = wait_terminal(created["id"])
    assert row.status == "completed"
    assert gw.upstream_bodies()[-1]["stream"] is True


def test_a_cut_answer_fails_and_is_stored_failed(gw: Gateway) -> None:
    gw.script(text("Hello", " there"), answer_truncate_at=40)
    r = gw.post({"model": "m", "input": "x"})
    assert r.status_code == 200, r.text
    body = r.json()
    check_sdk_response(body)
    assert body["status"] == "failed" and body["error"]["code"] == "server_error"
    assert body["output"] == []
    assert Response.objects.get(id=body["id"]).status == "failed"


def test_an_answer_over_the_line_limit_fails(gw: Gateway, gateway_config: Any) -> None:
    gateway_config(responses__max_upstream_sse_line_bytes=2048)
    gw.script(text("x" * 3000))
    body = gw.post({"model": "m", "input": "x"}).json()
    assert body["status"] == "failed"
    assert "max_upstream_sse_line_bytes (2048 bytes)" in body["error"]["message"]
    assert Response.objects.get(id=body["id"]).status == "failed"


def test_an_upstream_error_status_is_relayed(gw: Gateway) -> None:
    gw.script(text("never"), error_status=400, error_message="bad prompt")
    r = gw.post({"model": "m", "input": "x"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == "bad prompt"
    gw.script(text("never"), error_status=500)
    body = gw.post({"model": "m", "input": "x"}).json()
    assert body["status"] == "failed" and body["error"]["code"] == "server_error"


def test_an_upstream_that_streams_anyway_is_read_as_a_stream(gw: Gateway) -> None:
    """Some OpenAI-compatible servers stream whatever ``stream`` says."""
    from tests.responses import scripts

    script = scripts.Script([text("still", " streamed")])
    answer = scripts.handler(script, gw.wire)

    async def always_stream(request: Any, rec: Any) -> Any:
        body = rec.json()
        body["stream"] = True
        rec.body = orjson.dumps(body)  # the handler decides by the body it reads
        return await answer(request, rec)

    gw.upstream.script(scripts.path_for(gw.wire), always_stream)
    body = gw.post({"model": "m", "input": "x"}).json()
    assert body["status"] == "completed"
    assert body["output"][0]["content"][0]["text"] == "still streamed"
