"""The spans of the Anthropic Messages server-tool loop (``docs/operations.md``, "Spans"): one
``chat {model}`` span per upstream round with that round's usage, the gateway tool calls between
them, every one under the request's server span (the test's own, as in tests/responses/test_spans.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from tests import span_capture
from tests.messages.test_server_tools import SEARCH, body, post, stream
from tests.responses.test_spans import ancestors, no_content, wait_spans
from tests.servers import LiveServer
from tests.tools.tools_servers import SearchProvider
from tests.upstream import (
    ScriptedUpstream,
    anthropic_error,
    anthropic_message,
    anthropic_tool_events,
    anthropic_tool_message,
    json_answer,
    sse,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def live_gateway(transactional_db: None) -> Iterator[LiveServer]:
    """The gateway with each request in a server span of its own (see the module docstring)."""
    yield from span_capture.serve_traced_gateway()


@pytest.fixture
def gw(
    live_gateway: LiveServer, upstream: ScriptedUpstream, provider: SearchProvider, gateway_config: Any
) -> Iterator[LiveServer]:
    gateway_config(llm_api_base=upstream.url, web_search__base_url=provider.url)
    with span_capture.installed():
        yield live_gateway


def test_each_round_of_the_loop_is_a_span_with_its_own_usage(
    gw: LiveServer, upstream: ScriptedUpstream
) -> None:
    upstream.script(
        "/v1/messages",
        json_answer(
            anthropic_tool_message([("call_1", "web_search", {"query": "gateway news"})], text="Searching.")
        ),
    )
    upstream.script("/v1/messages", json_answer(anthropic_message("News: fact number 1.")))
    r = post(gw, body([SEARCH]))
    assert r.status_code == 200, r.text
    wait_spans("chat ", count=2)
    spans = wait_spans("request /v1/messages")
    first, second = span_capture.named(spans, "chat ")
    (tool,) = span_capture.named(spans, "execute_tool ")
    assert {span_capture.parent_of(s) for s in (first, second, tool)} == {span_capture.parent_of(first)}
    assert "request /v1/messages" in ancestors(first, spans)
    assert first.end_time <= tool.start_time and tool.end_time <= second.start_time
    for span in (first, second):
        attrs = span.attributes or {}
        assert span.kind is SpanKind.CLIENT and span.status.status_code is StatusCode.UNSET
        assert attrs["gen_ai.provider.name"] == "anthropic"
        assert attrs["gen_ai.request.model"] == "test-model"
        assert attrs["gen_ai.response.id"] == "msg_3f9c0000000000000000000000"
    assert tuple((first.attributes or {})["gen_ai.response.finish_reasons"]) == ("tool_use",)
    assert tuple((second.attributes or {})["gen_ai.response.finish_reasons"]) == ("end_turn",)
    assert (second.attributes or {})["gen_ai.usage.input_tokens"] == 13
    assert (second.attributes or {})["gen_ai.usage.output_tokens"] == 3
    assert (tool.attributes or {})["gen_ai.tool.name"] == "web_search"
    no_content(spans)


def test_streamed_rounds_carry_their_usage_and_a_refused_round_ends_in_error(
    gw: LiveServer, upstream: ScriptedUpstream
) -> None:
    upstream.script(
        "/v1/messages", sse(anthropic_tool_events([("call_1", "web_search", {"query": "gateway news"})]))
    )
    upstream.script(
        "/v1/messages", json_answer(anthropic_error("Overloaded", "overloaded_error"), status=529)
    )
    events = stream(gw, body([SEARCH]))
    assert events[-1][0] == "error"
    wait_spans("chat ", count=2)
    spans = wait_spans("request /v1/messages")
    first, second = span_capture.named(spans, "chat ")
    assert (first.attributes or {})["gen_ai.usage.input_tokens"] == 13
    assert tuple((first.attributes or {})["gen_ai.response.finish_reasons"]) == ("tool_use",)
    assert first.status.status_code is StatusCode.UNSET
    assert second.status.status_code is StatusCode.ERROR
    assert (second.attributes or {})["http.response.status_code"] == 529
