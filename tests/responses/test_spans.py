"""The gateway's own spans (``docs/operations.md``, "Spans") with an in-memory exporter, against the
live gateway and the scripted upstream: a stored tool-loop response's tree, a WebSocket response,
compaction, multi-agent agents, failures, content capture, and no spans without a provider.

Each request runs in a server span of the test's own (``tests.span_capture.request_spans``), standing
in for the server instrumentation: every gateway span must descend from it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from gateway.core import spans as gateway_spans
from tests import span_capture
from tests.responses.conftest import Gateway, sse_events
from tests.responses.scripts import Script, call, handler, text
from tests.responses.test_multi_agent import MA, route, two_subagents
from tests.responses.tool_fixtures import ToolsGateway, args
from tests.responses.wsutil import Client, connect, create
from tests.servers import LiveServer, free_port

pytestmark = pytest.mark.django_db(transaction=True)

CONTENT_KEYS = (
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
)


@pytest.fixture
def live_gateway(transactional_db: None) -> Iterator[LiveServer]:
    """The gateway with each request in a server span of its own (see the module docstring)."""
    yield from span_capture.serve_traced_gateway()


@pytest.fixture
def recorded() -> Iterator[None]:
    with span_capture.installed():
        yield


def wait_spans(*names: str, count: int = 1, timeout: float = 10) -> list[ReadableSpan]:
    """The finished spans once ``count`` spans named like each of ``names`` (a prefix) have ended."""
    deadline = time.monotonic() + timeout
    while True:
        spans = span_capture.finished()
        if all(len(span_capture.named(spans, n)) >= count for n in names):
            return spans
        if time.monotonic() > deadline:
            raise AssertionError(f"spans {names} not all ended: {[s.name for s in spans]}")
        time.sleep(0.02)


def ancestors(span: ReadableSpan, spans: list[ReadableSpan]) -> list[str]:
    """The names of ``span``'s ancestors among ``spans``, nearest first."""
    by_id = {s.context.span_id: s for s in spans}
    out = []
    parent = span_capture.parent_of(span)
    while parent is not None and parent in by_id:
        out.append(by_id[parent].name)
        parent = span_capture.parent_of(by_id[parent])
    return out


def no_content(spans: list[ReadableSpan]) -> None:
    for span in spans:
        assert not set(CONTENT_KEYS) & set(span.attributes or {}), span.name


def tool_loop(gw: ToolsGateway) -> dict[str, Any]:
    gw.script(
        call("web_search", args(queries=["python asyncio"]), call_id="call_ws1"),
        usage={"input_tokens": 30, "output_tokens": 5, "total_tokens": 35},
    )
    gw.script(
        text("Asyncio", " is a library."), usage={"input_tokens": 50, "output_tokens": 9, "total_tokens": 59}
    )
    events = gw.events({"model": "m", "input": "what is asyncio?", "tools": [{"type": "web_search"}]})
    return dict(events[-1]["response"])


def test_a_stored_tool_loop_response_is_one_tree_of_rounds_tools_and_its_write(
    tools_gw: ToolsGateway, recorded: None
) -> None:
    final = tool_loop(tools_gw)
    assert final["status"] == "completed"
    spans = wait_spans("request /v1/responses", "store response")
    rounds = span_capture.named(spans, "chat ")
    (tool,) = span_capture.named(spans, "execute_tool ")
    (store,) = span_capture.named(spans, "store response")
    (request,) = span_capture.named(spans, "request ")
    assert [r.name for r in rounds] == ["chat m", "chat m"]
    # One parent for the rounds, the tool call and the write: the request's span or one below it.
    parents = {span_capture.parent_of(s) for s in (*rounds, tool, store)}
    assert len(parents) == 1
    assert "request /v1/responses" in ancestors(rounds[0], spans)
    assert {s.context.trace_id for s in spans} == {request.context.trace_id}
    first, second = rounds
    assert first.end_time <= tool.start_time and tool.end_time <= second.start_time
    for r in rounds:
        assert r.kind is SpanKind.CLIENT and r.status.status_code is StatusCode.UNSET
        attrs = r.attributes or {}
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.provider.name"] == "openai"
        assert attrs["gen_ai.request.model"] == attrs["gen_ai.response.model"] == "m"
        assert str(attrs["gen_ai.response.id"]).startswith(("resp_", "chatcmpl-"))
    # Each round's own usage, not the response's running total.
    assert (first.attributes or {})["gen_ai.usage.input_tokens"] == 30
    assert (first.attributes or {})["gen_ai.usage.output_tokens"] == 5
    assert (second.attributes or {})["gen_ai.usage.input_tokens"] == 50
    assert (second.attributes or {})["gen_ai.usage.output_tokens"] == 9
    assert tuple((first.attributes or {})["gen_ai.response.finish_reasons"]) == ("tool_calls",)
    assert tuple((second.attributes or {})["gen_ai.response.finish_reasons"]) == ("stop",)
    assert tool.name == "execute_tool web_search"
    assert dict(tool.attributes or {}) | {"gen_ai.tool.call.id": "-"} == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "web_search",
        "gen_ai.tool.call.id": "-",
        "gen_ai.tool.type": "extension",
        "gateway.tool.kind": "web_search",
    }
    assert (tool.attributes or {})["gen_ai.tool.call.id"] == "call_ws1"
    assert tool.status.status_code is StatusCode.UNSET
    assert (store.attributes or {})["gateway.response.id"] == final["id"]
    assert (store.attributes or {})["gateway.response.status"] == "completed"
    no_content(spans)


def test_content_is_captured_only_when_configured_bounded_and_without_credentials(
    tools_gw: ToolsGateway, recorded: None
) -> None:
    assert tools_gw.configure is not None
    tools_gw.configure(observability__capture_content=True)
    secret = "sk-secret-span-test"
    tools_gw.script(call("web_search", args(queries=["python asyncio"]), call_id="call_ws1"))
    tools_gw.script(text("Asyncio", " is a library."))
    long_input = "what is asyncio? " + "x" * (gateway_spans.MAX_CONTENT_CHARS * 2)
    sse_events(
        httpx.post(
            f"{tools_gw.url}/v1/responses",
            json={"model": "m", "input": long_input, "tools": [{"type": "web_search"}], "stream": True},
            headers={"Authorization": f"Bearer {secret}"},
            timeout=30,
        )
    )
    spans = wait_spans("request /v1/responses", "store response")
    first, second = span_capture.named(spans, "chat ")
    (tool,) = span_capture.named(spans, "execute_tool ")
    sent = str((first.attributes or {})["gen_ai.input.messages"])
    assert "what is asyncio?" in sent
    assert len(sent) <= gateway_spans.MAX_CONTENT_CHARS + len("…[truncated]")
    assert "Asyncio is a library." in str((second.attributes or {})["gen_ai.output.messages"])
    assert "python asyncio" in str((tool.attributes or {})["gen_ai.tool.call.arguments"])
    assert (tool.attributes or {})["gen_ai.tool.call.result"]
    for span in spans:
        assert secret not in orjson.dumps(dict(span.attributes or {}), default=str).decode(), span.name


@pytest.mark.parametrize("wire", ["responses"])
def test_a_failed_tool_call_and_a_failed_round_end_their_spans_in_error(
    tools_gw: ToolsGateway, recorded: None
) -> None:
    assert tools_gw.configure is not None
    tools_gw.configure(web_search__base_url=f"http://127.0.0.1:{free_port()}")  # nothing listens
    tools_gw.script(call("web_search", args(queries=["q"]), call_id="call_ws1"))
    tools_gw.script(text("x"), error_status=500)
    events = tools_gw.events({"model": "m", "input": "hi", "tools": [{"type": "web_search"}]})
    assert events[-1]["type"] == "response.failed"
    spans = wait_spans("request /v1/responses", "store response")
    (tool,) = span_capture.named(spans, "execute_tool ")
    assert tool.status.status_code is StatusCode.ERROR
    assert (tool.attributes or {})["error.type"] == "tool_error"
    ok, failed = span_capture.named(spans, "chat ")
    assert ok.status.status_code is StatusCode.UNSET
    assert failed.status.status_code is StatusCode.ERROR
    assert (failed.attributes or {})["error.type"] == "StreamFailure"
    assert (failed.attributes or {})["http.response.status_code"] == 500


@pytest.mark.parametrize("wire", ["responses"])
def test_a_websocket_response_nests_under_its_connection(gw: Gateway, recorded: None) -> None:
    gw.upstream.script("/v1/responses", handler(Script([text("Hello", " there")])))

    async def scenario() -> list[dict[str, Any]]:
        ws = await connect(gw.url)
        client = Client(ws)
        await client.send(create(model="test-model", input="hi"))
        events = await client.until_terminal()
        await ws.close()
        return events

    events = asyncio.run(scenario())
    assert events[-1]["type"] == "response.completed"
    spans = wait_spans("request /v1/responses", "chat ", "store response")
    (round_,) = span_capture.named(spans, "chat ")
    assert round_.name == "chat test-model"
    assert "request /v1/responses" in ancestors(round_, spans)
    assert (round_.attributes or {})["gen_ai.usage.output_tokens"] == 7
    (store,) = span_capture.named(spans, "store response")
    assert span_capture.parent_of(store) == span_capture.parent_of(round_)
    no_content(spans)


def test_compaction_is_a_span_over_its_summary_round(gw: Gateway, recorded: None) -> None:
    gw.script(
        text("The user wants a cheap hotel."),
        usage={"input_tokens": 40, "output_tokens": 6, "total_tokens": 46},
    )
    r = gw.post(
        {"model": "m", "input": [{"role": "user", "content": "Lisbon?"}, {"type": "compaction_trigger"}]}
    )
    assert r.status_code == 200, r.text
    spans = wait_spans("request /v1/responses", "compaction")
    (compaction,) = span_capture.named(spans, "compaction")
    (summary,) = span_capture.named(spans, "chat ")
    assert span_capture.parent_of(summary) == compaction.context.span_id
    assert "request /v1/responses" in ancestors(compaction, spans)
    attrs = summary.attributes or {}
    assert attrs["gateway.round.kind"] == "compaction"
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (40, 6)
    assert attrs["gen_ai.response.model"] == "m"
    no_content(spans)


@pytest.mark.parametrize("wire", ["responses"])
def test_each_agent_of_a_multi_agent_response_is_an_invoke_agent_span_over_its_rounds(
    gw: Gateway, recorded: None
) -> None:
    route(gw, two_subagents, 8)
    events = sse_events(
        httpx.post(
            f"{gw.url}/v1/responses",
            json={"model": "m", "input": "do two things", "multi_agent": MA, "stream": True},
            headers={"OpenAI-Beta": "responses_multi_agent=v1"},
            timeout=30,
        )
    )
    assert events[-1]["type"] == "response.completed"
    spans = wait_spans("request /v1/responses", "store response")
    agents = {s.name: s for s in span_capture.named(spans, "invoke_agent ")}
    assert set(agents) == {"invoke_agent /root", "invoke_agent /root/a", "invoke_agent /root/b"}
    assert len({span_capture.parent_of(a) for a in agents.values()}) == 1
    for name, agent in agents.items():
        assert (agent.attributes or {})["gen_ai.agent.name"] == name.removeprefix("invoke_agent ")
        assert (agent.attributes or {})["gen_ai.operation.name"] == "invoke_agent"
        assert "request /v1/responses" in ancestors(agent, spans)
    rounds = span_capture.named(spans, "chat ")
    by_agent = {
        name: [r for r in rounds if span_capture.parent_of(r) == a.context.span_id]
        for name, a in agents.items()
    }
    assert len(by_agent["invoke_agent /root/a"]) == len(by_agent["invoke_agent /root/b"]) == 1
    assert len(by_agent["invoke_agent /root"]) >= 2
    assert sum(len(v) for v in by_agent.values()) == len(rounds)  # every round under its agent


@pytest.mark.parametrize("wire", ["responses"])
def test_no_span_is_recorded_without_a_tracer_provider(gw: Gateway, recorded: None) -> None:
    gw.script(text("one"))
    assert gw.post({"model": "m", "input": "hi"}).status_code == 200
    # Recorded while a provider is installed; the stored write may end after the answer: wait for it
    # too, so that no span of this first request lands after the clear.
    assert span_capture.named(wait_spans("chat ", "store response"), "chat ")
    span_capture.EXPORTER.clear()
    with span_capture.no_provider():
        gw.script(text("two"))
        assert gw.post({"model": "m", "input": "hi"}).status_code == 200
        time.sleep(0.2)
    assert span_capture.finished() == []
