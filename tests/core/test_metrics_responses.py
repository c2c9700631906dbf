"""The operator metrics of responses on ``/metrics``: time to first token and per output token by
model, gateway tool call duration by tool, and responses in flight; against the live gateway and the
scripted upstream (``docs/operations.md``, "Metrics")."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.core.metrics import REGISTRY
from tests.responses import conftest as responses_fixtures
from tests.responses import tool_fixtures
from tests.responses.conftest import Gateway
from tests.responses.scripts import call, text
from tests.responses.tool_fixtures import ToolsGateway, args
from tests.servers import free_port
from usage_app import metrics as usage_metrics

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.parametrize("wire", ["responses"])]

MODEL = "metrics-model"
# The Responses tests' live gateway over the scripted upstream, and its tool-loop variant.
gw, wire, tools_gw = responses_fixtures.gw, responses_fixtures.wire, tool_fixtures.tools_gw


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def known_model() -> Iterator[str]:
    """``MODEL`` is one the upstream lists, so it has a label of its own."""
    before = usage_metrics._known
    usage_metrics.models_listed([MODEL])
    yield MODEL
    usage_metrics._known = before


def test_time_to_first_token_and_per_output_token_of_a_streamed_response(
    gw: Gateway, known_model: str
) -> None:
    ttft = ("gateway_time_to_first_token_seconds_count", "gateway_time_to_first_token_seconds_sum")
    tpot = ("gateway_time_per_output_token_seconds_count", "gateway_time_per_output_token_seconds_sum")
    before = {n: sample(n, model=known_model) for n in (*ttft, *tpot)}
    # Each event after a 30 ms pause: four before the first delta (created, in_progress, item added,
    # part added), then eleven more deltas and the closing events; twelve output tokens reported.
    gw.script(
        text("a", *["b"] * 11),
        delay_s=0.03,
        usage={"input_tokens": 3, "output_tokens": 12, "total_tokens": 15},
    )
    events = gw.stream({"model": known_model, "input": "hi"})
    assert events[-1]["type"] == "response.completed"
    delta = {n: sample(n, model=known_model) - before[n] for n in before}
    assert delta[ttft[0]] == 1 and delta[tpot[0]] == 1
    assert delta[ttft[1]] >= 0.1
    # After the first delta: about 0.45 s over eleven further tokens, more than the wait for the first.
    assert delta[tpot[1]] >= 0.02
    assert delta[ttft[1]] < delta[tpot[1]] * 11
    # A model the upstream does not list is "other".
    other = sample("gateway_time_to_first_token_seconds_count", model="other")
    gw.script(text("x", "y"))
    gw.stream({"model": "not-listed", "input": "hi"})
    assert sample("gateway_time_to_first_token_seconds_count", model="other") == other + 1
    assert sample("gateway_time_to_first_token_seconds_count", model="not-listed") == 0
    # A JSON client's rounds are single answers, not streams: nothing to observe.
    gw.script(text("z"))
    assert gw.post({"model": known_model, "input": "hi"}).status_code == 200
    assert sample(ttft[0], model=known_model) == before[ttft[0]] + 1


def test_tool_call_duration_by_tool_and_outcome(tools_gw: ToolsGateway) -> None:
    def count(outcome: str) -> float:
        return sample("gateway_tool_call_duration_seconds_count", tool="web_search", outcome=outcome)

    ok, failed = count("ok"), count("error")
    tools_gw.script(call("web_search", args(queries=["q"])))
    tools_gw.script(text("done"))
    tools_gw.events({"model": "m", "input": "hi", "tools": [{"type": "web_search"}]})
    assert (count("ok"), count("error")) == (ok + 1, failed)
    assert tools_gw.configure is not None
    tools_gw.configure(web_search__base_url=f"http://127.0.0.1:{free_port()}")  # nothing listens
    tools_gw.script(call("web_search", args(queries=["q"])))
    tools_gw.script(text("done"))
    tools_gw.events({"model": "m", "input": "hi", "tools": [{"type": "web_search"}]})
    assert (count("ok"), count("error")) == (ok + 1, failed + 1)
    exposed = httpx.get(f"{tools_gw.url}/metrics", timeout=10).text
    assert 'gateway_tool_call_duration_seconds_count{outcome="error",tool="web_search"}' in exposed


def test_responses_in_flight_rise_during_a_response_and_fall_after(gw: Gateway) -> None:
    before = sample("gateway_responses_in_flight")
    gw.script(text("a", "b", "c", "d"), delay_s=0.05)
    done: list[Any] = []
    streaming = threading.Thread(target=lambda: done.append(gw.stream({"model": "m", "input": "hi"})))
    streaming.start()
    deadline = time.monotonic() + 5
    seen = before
    while time.monotonic() < deadline and seen == before:
        seen = sample("gateway_responses_in_flight")
        time.sleep(0.01)
    assert seen == before + 1
    streaming.join(15)
    assert done and done[0][-1]["type"] == "response.completed"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and sample("gateway_responses_in_flight") != before:
        time.sleep(0.01)
    assert sample("gateway_responses_in_flight") == before
    assert "gateway_responses_in_flight" in httpx.get(f"{gw.url}/metrics", timeout=10).text
    # A response refused before it ran leaves nothing behind.
    r = gw.post({"model": "m", "input": "hi", "tools": [{"type": "nonsense"}]})
    assert r.status_code == 400
    assert sample("gateway_responses_in_flight") == before
