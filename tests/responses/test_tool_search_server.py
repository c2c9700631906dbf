"""Server-executed ``tool_search`` (issue 57): the gateway searches the request's deferred tools.

The model sees a ``tool_search`` function; its call runs in the gateway (a keyword ranking over
the deferred tools' names and descriptions), comes back as OpenAI's ``tool_search_call`` and
``tool_search_output`` items (``execution: "server"``), and the tools found are offered to the
model in the next round, and in every continuation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from responses_app.engine.tool_search import MAX_RESULTS, ServerToolSearch
from responses_app.models import Response
from tests.responses.conftest import Gateway, check_sdk_event, check_sdk_response
from tests.responses.scripts import Script, call, handler, text
from tests.responses.wsutil import Client, connect, create
from tests.servers import LiveServer

SEARCH = {"type": "tool_search"}  # the SDK's default execution: the server's
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current conditions for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "defer_loading": True,
}
EMAIL = {
    "type": "function",
    "name": "send_email",
    "description": "Send a message to someone.",
    "parameters": {"type": "object", "properties": {}},
    "defer_loading": True,
}
ARCHIVE = {
    "type": "function",
    "name": "archive",
    "description": "Archive a customer record (weather permitting).",
    "parameters": {"type": "object", "properties": {}},
    "defer_loading": True,
}
LOOKUP = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}
CRM = {"type": "namespace", "name": "crm", "description": "Customer tools.", "tools": [LOOKUP, ARCHIVE]}
TOOLS = [SEARCH, WEATHER, EMAIL, CRM]


def _names(gw: Gateway, body: dict[str, Any]) -> list[str]:
    if gw.wire == "responses":
        return [t.get("name", "") for t in body.get("tools") or ()]
    return [t["function"]["name"] for t in body.get("tools") or ()]


def test_ranking_weighs_names_over_descriptions_and_groups_namespace_members() -> None:
    search = ServerToolSearch.from_tools(TOOLS)
    assert search is not None
    # "weather" is in get_weather's name and only in archive's description: name first.
    assert search.search("the weather") == [
        WEATHER,
        {"type": "namespace", "name": "crm", "description": "Customer tools.", "tools": [ARCHIVE]},
    ]
    # Declared first, found by its description only: still ranked after the name match.
    reordered = ServerToolSearch.from_tools([SEARCH, ARCHIVE, WEATHER])
    assert reordered is not None and reordered.search("weather") == [WEATHER, ARCHIVE]
    assert search.search("emails") == [EMAIL]  # a plural finds the singular
    assert search.search("customers") == [  # the namespace's own words count for its members
        {"type": "namespace", "name": "crm", "description": "Customer tools.", "tools": [ARCHIVE]}
    ]
    assert search.search("quantum") == []
    many = [{**WEATHER, "name": f"weather_{n}"} for n in range(MAX_RESULTS + 2)]
    found = ServerToolSearch.from_tools([SEARCH, *many])
    assert found is not None and len(found.search("weather")) == MAX_RESULTS
    assert ServerToolSearch.from_tools([{**SEARCH, "execution": "client"}, WEATHER]) is None


def test_the_gateway_searches_and_the_model_calls_what_it_found(gw: Gateway) -> None:
    gw.script(call("tool_search", '{"query": "weather', ' in Paris"}', call_id="call_ts"))
    gw.script(call("get_weather", '{"city": "Paris"}', call_id="call_w"))
    events = gw.stream({"model": "test-model", "input": "weather in Paris?", "tools": TOOLS})
    first, second = gw.upstream_bodies()
    # The deferred tools are withheld until found; the search is a function for the model.
    assert _names(gw, first) == ["crm__lookup", "tool_search"]
    assert _names(gw, second) == ["crm__lookup", "get_weather", "crm__archive", "tool_search"]
    for event in events:
        check_sdk_event(event)
    final = events[-1]["response"]
    assert final["status"] == "completed"
    search_call, search_output, weather = final["output"]
    assert search_call == {
        "id": search_call["id"],
        "type": "tool_search_call",
        "call_id": "call_ts",
        "arguments": {"query": "weather in Paris"},
        "execution": "server",
        "status": "completed",
    }
    assert search_call["id"].startswith("tsc_") and search_output["id"].startswith("tso_")
    crm_found = {"type": "namespace", "name": "crm", "description": "Customer tools.", "tools": [ARCHIVE]}
    assert search_output == {
        "id": search_output["id"],
        "type": "tool_search_output",
        "call_id": "call_ts",
        "execution": "server",
        "status": "completed",
        "tools": [WEATHER, crm_found],
    }
    assert weather["type"] == "function_call" and weather["name"] == "get_weather"
    # Each item streamed whole, in order.
    done = [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"]
    assert done == ["tool_search_call", "tool_search_output", "function_call"]
    assert final["tools"][0] == SEARCH  # echoed as declared
    # The model saw its search as a function call and the tools found as its output.
    if gw.wire == "responses":
        pair = [i for i in second["input"] if i["type"] in ("function_call", "function_call_output")]
        assert pair[0]["name"] == "tool_search" and pair[0]["call_id"] == "call_ts"
        assert pair[1]["call_id"] == "call_ts" and '"name":"get_weather"' in pair[1]["output"]
    else:
        assistant = next(m for m in second["messages"] if m["role"] == "assistant")
        assert assistant["tool_calls"][0]["function"]["name"] == "tool_search"
        tool = next(m for m in second["messages"] if m["role"] == "tool")
        assert '"name":"get_weather"' in tool["content"]

    # A continuation offers the tools found (from the stored output) without searching again.
    gw.script(text("sunny"))
    follow = gw.post(
        {
            "model": "test-model",
            "previous_response_id": final["id"],
            "input": [{"type": "function_call_output", "call_id": "call_w", "output": "sunny"}],
            "tools": TOOLS,
        }
    )
    assert follow.status_code == 200, follow.text
    check_sdk_response(follow.json())
    assert "get_weather" in _names(gw, gw.upstream_bodies()[-1])


def test_a_search_counts_against_max_tool_calls(gw: Gateway) -> None:
    gw.script(call("tool_search", '{"query": "weather"}', call_id="call_1"))
    gw.script(call("tool_search", '{"query": "email"}', call_id="call_2"))
    gw.script(text("no more searching"))
    r = gw.post({"model": "test-model", "input": "x", "tools": TOOLS, "max_tool_calls": 1})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [i["type"] for i in body["output"]] == ["tool_search_call", "tool_search_output", "message"]
    third = gw.upstream_bodies()[2]
    assert "tool_search" not in _names(gw, third)  # no built-in tool is offered past the limit
    assert "send_email" not in _names(gw, third)  # the refused search loaded nothing


def test_server_items_given_back_unstored_load_their_tools(gw: Gateway) -> None:
    gw.script(text("ok"))
    items = [
        {"role": "user", "content": "weather?"},
        {
            "type": "tool_search_call",
            "call_id": "ts1",
            "arguments": {"query": "weather"},
            "execution": "server",
            "status": "completed",
        },
        {
            "type": "tool_search_output",
            "call_id": "ts1",
            "execution": "server",
            "status": "completed",
            "tools": [WEATHER],
        },
    ]
    r = gw.post({"model": "test-model", "store": False, "input": items, "tools": TOOLS})
    assert r.status_code == 200, r.text
    assert "get_weather" in _names(gw, gw.upstream_bodies()[0])
    assert Response.objects.count() == 0


REFUSALS: list[tuple[list[dict[str, Any]], str, str, str]] = [
    (
        [{**SEARCH, "parameters": {"type": "object"}}],
        "unsupported_parameter",
        "tools[0].parameters",
        "'parameters' applies to a client-executed tool search ('execution': 'client') only; "
        "the gateway's own search takes a 'query'.",
    ),
    (
        [SEARCH, {**LOOKUP, "name": "tool_search"}],
        "tool_name_collision",
        "tools[1]",
        "Invalid 'tools[1]': tool 'tool_search' reaches the model under the same name as the "
        "server-executed tool search. Tool names must be unique.",
    ),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("tools", "code", "param", "message"), REFUSALS)
@pytest.mark.parametrize("stream", [False, True])
def test_refusals_store_nothing(
    gw: Gateway, tools: list[dict[str, Any]], code: str, param: str, message: str, stream: bool
) -> None:
    gw.script(text("never"))
    r = gw.post({"model": "test-model", "input": "x", "tools": tools, "stream": stream})
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": code,
    }
    assert gw.upstream_bodies() == []
    assert Response.objects.count() == 0


def test_websocket_server_search(
    live_gateway: LiveServer, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    gateway_config(llm_api_base=upstream.url, upstream_api="responses")
    upstream.script(
        "/v1/responses", handler(Script([call("tool_search", '{"query": "email"}', call_id="c")]))
    )
    upstream.script("/v1/responses", handler(Script([text("found it")])))

    async def scenario() -> list[dict[str, Any]]:
        async with await connect(live_gateway.url) as ws:
            c = Client(ws)
            await c.send(create(store=False, input="mail someone", tools=TOOLS))
            return await c.until_terminal()

    events = asyncio.run(scenario())
    assert events[-1]["type"] == "response.completed", events[-1]
    output = events[-1]["response"]["output"]
    assert [i["type"] for i in output] == ["tool_search_call", "tool_search_output", "message"]
    assert output[1]["tools"] == [EMAIL]
    sent = [r.json() for r in upstream.requests if r.path == "/v1/responses"]
    assert "send_email" in [t["name"] for t in sent[1]["tools"]]
