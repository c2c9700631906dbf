"""The gateway tool loop through the public API: web search and the code interpreter, rounds,
concurrency, failures fed back, the round cap, and client calls in a gateway round.

Everything runs against the live gateway with the scripted vLLM upstream (both wire APIs), the real
SearXNG-compatible provider on loopback and the real bubblewrap sandbox.
"""

from __future__ import annotations

import time

import httpx
import orjson

from tests.responses.scripts import call, text
from tests.responses.tool_fixtures import ToolsGateway, args, model_input, offered_tools, types_of

CODE_TOOL = {"type": "code_interpreter", "container": {"type": "auto"}}
WEB_SEARCH_EVENTS = [
    "response.output_item.added",
    "response.web_search_call.in_progress",
    "response.web_search_call.searching",
    "response.web_search_call.completed",
    "response.output_item.done",
]
MESSAGE_EVENTS = [
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


def test_web_search_runs_and_the_model_gets_the_results(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    gw.script(call("web_search", '{"queries": ', '["python asyncio"]}', call_id="call_ws1"))
    gw.script(text("Asyncio is a library."))
    events = gw.events({"model": "m", "input": "what is asyncio?", "tools": [{"type": "web_search"}]})
    assert types_of(events) == [
        "response.created",
        "response.in_progress",
        *WEB_SEARCH_EVENTS,
        *MESSAGE_EVENTS,
        "response.completed",
    ]
    added, done = events[2], events[6]
    item_id = added["item"]["id"]
    assert item_id.startswith("ws_")
    assert added["item"] == {
        "id": item_id,
        "type": "web_search_call",
        "status": "in_progress",
        "action": {"type": "search", "query": "python asyncio", "queries": ["python asyncio"]},
    }
    assert all(e["item_id"] == item_id and e["output_index"] == 0 for e in events[3:6])
    # Sources only when include asks for them.
    assert done["item"] == {**added["item"], "status": "completed"}
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert [i["type"] for i in final["output"]] == ["web_search_call", "message"]
    assert final["output"][0] == done["item"]
    assert final["tools"] == [  # echoed with OpenAI's defaults
        {
            "type": "web_search",
            "search_context_size": "medium",
            "user_location": {
                "type": "approximate",
                "city": None,
                "country": "US",
                "region": None,
                "timezone": None,
            },
        }
    ]
    assert final["tool_usage"]["web_search"] == {"num_requests": 1}

    # Round 1 offered web_search as a plain function; round 2 gave the model the call and results.
    assert offered_tools(gw, 0) == ["web_search"]
    seen = model_input(gw, 1)
    assert seen[0] == {"text": ("user", "what is asyncio?")}
    assert seen[1] == {"call": ("web_search", '{"queries": ["python asyncio"]}', "call_ws1")}
    call_id, output = seen[2]["output"]
    assert call_id == "call_ws1"
    assert "python asyncio result 1" in output and "https://example.com/python-asyncio/1" in output
    assert len(seen) == 3
    assert gw.provider is not None and [r.query["q"] for r in gw.provider.requests] == ["python asyncio"]
    # Nothing of the built-in tool declaration reaches the model server.
    for body in gw.upstream_bodies():
        assert all(t.get("type") == "function" for t in body.get("tools", []))

    # Retrieved: the same public items (the model's private view is never returned).
    stored = httpx.get(f"{gw.url}/v1/responses/{final['id']}").json()
    assert stored["output"] == final["output"]


def test_sources_are_returned_when_include_asks(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    gw.script(call("web_search", args(queries=["rust"])))
    gw.script(text("ok"))
    final = gw.create(
        {
            "model": "m",
            "input": "x",
            "tools": [{"type": "web_search_preview"}],
            "include": ["web_search_call.action.sources"],
        }
    )
    action = final["output"][0]["action"]
    assert action["sources"] == [
        {"type": "url", "url": "https://example.com/rust/1"},
        {"type": "url", "url": "https://docs.python.org/rust/2"},
        {"type": "url", "url": "https://blocked.example.org/rust/3"},
    ]
    # The gateway's include entries are not forwarded to the model server.
    assert "include" not in gw.upstream_bodies()[0]


def test_include_entries_not_about_gateway_tools_are_forwarded_on_the_responses_wire(
    tools_gw: ToolsGateway,
) -> None:
    """docs/responses.md: the gateway keeps its own tools' ``include`` entries; the others reach a
    ``responses`` upstream; the chat wire has no ``include``."""
    gw = tools_gw
    gw.script(call("web_search", args(queries=["rust"])))
    gw.script(text("ok"))
    gw.create(
        {
            "model": "m",
            "input": "x",
            "tools": [{"type": "web_search_preview"}],
            "include": ["web_search_call.action.sources", "reasoning.encrypted_content"],
        }
    )
    for body in gw.upstream_bodies():
        if gw.wire == "responses":
            assert body["include"] == ["reasoning.encrypted_content"]
        else:
            assert "include" not in body


def test_gateway_calls_of_a_round_run_concurrently_and_return_in_call_order(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    assert gw.provider is not None
    gw.provider.hold_until = 5  # each search waits at the provider until all five are there
    queries = ["alpha", "beta", "gamma", "delta", "epsilon"]
    gw.script(*(call("web_search", args(queries=[q]), call_id=f"call_{q}") for q in queries))
    gw.script(text("done"))
    final = gw.create({"model": "m", "input": "x", "tools": [{"type": "web_search"}]})
    assert gw.provider.peak_in_flight == 5, "the round's five searches ran one after another"
    assert [i["action"]["query"] for i in final["output"][:5]] == queries
    assert all(i["status"] == "completed" for i in final["output"][:5])
    seen = model_input(gw, 1)
    calls = [s["call"][2] for s in seen if "call" in s]
    outputs = [s["output"][0] for s in seen if "output" in s]
    assert calls == outputs == [f"call_{q}" for q in queries]
    assert all(
        f"{q} result 1" in s["output"][1]
        for q, s in zip(queries, [s for s in seen if "output" in s], strict=True)
    )


def test_a_failed_call_is_fed_back_and_the_response_completes(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    assert gw.provider is not None
    gw.provider.error = (429, {"error": "Too many requests, slow down."})
    gw.script(call("web_search", args(queries=["cats"]), call_id="call_f"))
    gw.script(text("The search failed."))
    events = gw.events({"model": "m", "input": "x", "tools": [{"type": "web_search"}]})
    assert types_of(events)[2:6] == [
        "response.output_item.added",
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.output_item.done",  # no completed event for a failed search
    ]
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert final["output"][0]["status"] == "failed"
    call_id, output = model_input(gw, 1)[2]["output"]
    assert call_id == "call_f"
    error = orjson.loads(output)["error"]
    assert "429" in error and "Too many requests, slow down." in error


def test_a_call_that_times_out_is_a_failed_output(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    assert gw.configure is not None
    gw.configure(tools__call_timeout_s=0.5)
    assert gw.provider is not None
    gw.provider.slow_delay_s = 3.0
    gw.script(
        call("web_search", args(queries=["slow one"]), call_id="call_slow"),
        call("web_search", args(queries=["fast"]), call_id="call_fast"),
    )
    gw.script(text("partial"))
    final = gw.create({"model": "m", "input": "x", "tools": [{"type": "web_search"}]})
    # The response ended while the provider was still answering the slow search: nobody waited for it.
    assert gw.provider.in_flight == 1
    assert [i["status"] for i in final["output"][:2]] == ["failed", "completed"]
    outputs = {s["output"][0]: s["output"][1] for s in model_input(gw, 1) if "output" in s}
    assert orjson.loads(outputs["call_slow"]) == {"error": "web_search call timed out after 0.5 s"}
    assert "fast result 1" in outputs["call_fast"]
    assert final["status"] == "completed"


def test_the_round_cap_ends_the_response_incomplete(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    assert gw.configure is not None
    gw.configure(responses__max_rounds=3)
    for n in range(3):
        gw.script(call("web_search", args(queries=[f"q{n}"])))
    events = gw.events({"model": "m", "input": "x", "tools": [{"type": "web_search"}]})
    assert events[-1]["type"] == "response.incomplete"
    final = events[-1]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [i["action"]["query"] for i in final["output"]] == ["q0", "q1", "q2"]
    assert len(gw.upstream_bodies()) == 3
    stored = httpx.get(f"{gw.url}/v1/responses/{final['id']}").json()
    assert stored["status"] == "incomplete"


def test_the_default_round_cap_is_ten(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    for n in range(10):
        gw.script(call("web_search", args(queries=[f"q{n}"])))
    final = gw.create({"model": "m", "input": "x", "tools": [{"type": "web_search"}]})
    assert final["status"] == "incomplete"
    assert len(final["output"]) == 10
    assert len(gw.upstream_bodies()) == 10


def test_client_calls_end_the_response_after_the_gateway_calls_of_the_round(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    weather = {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    gw.script(
        call("web_search", args(queries=["paris"]), call_id="call_ws"),
        call("get_weather", args(city="Paris"), call_id="call_client"),
    )
    events = gw.events({"model": "m", "input": "x", "tools": [{"type": "web_search"}, weather]})
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert [i["type"] for i in final["output"]] == ["web_search_call", "function_call"]
    assert final["output"][0]["status"] == "completed"  # ran and recorded
    assert final["output"][1]["call_id"] == "call_client"
    assert len(gw.upstream_bodies()) == 1  # the response ended with the client call
    assert sorted(offered_tools(gw, 0)) == ["get_weather", "web_search"]

    # The client answers; the model sees the search pair, its own client call, and the output.
    gw.script(text("Sunny."))
    second = gw.create(
        {
            "model": "m",
            "previous_response_id": final["id"],
            "input": [{"type": "function_call_output", "call_id": "call_client", "output": "sunny"}],
            "tools": [{"type": "web_search"}, weather],
        }
    )
    assert second["output"][0]["content"][0]["text"] == "Sunny."
    seen = model_input(gw, 1)
    assert {"call": ("web_search", args(queries=["paris"]), "call_ws")} in seen
    assert {"call": ("get_weather", args(city="Paris"), "call_client")} in seen
    assert {"output": ("call_client", "sunny")} in seen
    ws_output = next(s["output"][1] for s in seen if "output" in s and s["output"][0] == "call_ws")
    # The continuation gives the model exactly what it saw: the stored results text.
    assert "paris result 1" in ws_output


def test_code_interpreter_runs_in_the_sandbox(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    code = "print(6 * 7)"
    gw.script(call("code_interpreter", args(code=code), call_id="call_ci"))
    gw.script(text("42"))
    events = gw.events(
        {
            "model": "m",
            "input": "x",
            "tools": [{"type": "code_interpreter", "container": {"type": "auto"}}],
            "include": ["code_interpreter_call.outputs"],
        }
    )
    assert types_of(events)[2:10] == [
        "response.output_item.added",
        "response.code_interpreter_call.in_progress",
        "response.code_interpreter_call_code.delta",
        "response.code_interpreter_call_code.done",
        "response.code_interpreter_call.interpreting",
        "response.code_interpreter_call.completed",
        "response.output_item.done",
        "response.output_item.added",
    ]
    assert events[4]["delta"] == code and events[5]["code"] == code
    item = events[8]["item"]
    assert item["id"].startswith("ci_") and item["container_id"].startswith("cntr_")
    assert item["status"] == "completed" and item["code"] == code
    assert item["outputs"] == [{"type": "logs", "logs": "42\n"}]
    assert {"output": ("call_ci", "42\n")} in model_input(gw, 1)


def test_code_interpreter_outputs_need_include(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    gw.script(call("code_interpreter", args(code="print('hi')")))
    gw.script(text("ok"))
    final = gw.create({"model": "m", "input": "x", "tools": [CODE_TOOL]})
    assert final["output"][0]["outputs"] is None
    assert final["output"][0]["status"] == "completed"


def test_a_sandbox_limit_fails_the_call_not_the_response(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    assert gw.configure is not None
    gw.configure(code_interpreter__cpu_time_s=1)
    gw.script(call("code_interpreter", args(code="while True: pass"), call_id="call_loop"))
    gw.script(text("It ran too long."))
    events = gw.events({"model": "m", "input": "x", "tools": [CODE_TOOL]})
    assert "response.code_interpreter_call.completed" not in types_of(events)
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert final["output"][0]["status"] == "failed"
    output = next(s["output"][1] for s in model_input(gw, 1) if "output" in s)
    # CPU time (1 s) normally; on a starved machine the wall clock (10 s) can come first.
    assert "time limit of" in output and "program was stopped" in output


def test_unknown_and_ambiguous_tools_are_never_executed(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    # A client function named like the built-in makes "web_search" ambiguous: returned, not run.
    clash = {"type": "function", "name": "web_search", "parameters": {"type": "object"}}
    gw.script(call("web_search", args(queries=["x"]), call_id="call_amb"))
    final = gw.create({"model": "m", "input": "x", "tools": [{"type": "web_search"}, clash]})
    assert [i["type"] for i in final["output"]] == ["function_call"]
    assert gw.provider is not None and gw.provider.requests == []


def test_the_sdk_stream_helper_accumulates_the_tool_items(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    gw.script(
        call("web_search", args(queries=["one"])),
        call("web_search", args(queries=["two"])),
        call("code_interpreter", args(code="print(1)")),
    )
    gw.script(text("done"))
    with gw.client.responses.stream(
        model="m",
        input="x",
        tools=[{"type": "web_search"}, CODE_TOOL],
        max_tool_calls=2,
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [(o.type, o.status) for o in final.output] == [
        ("web_search_call", "completed"),
        ("web_search_call", "completed"),
        ("code_interpreter_call", "interpreting"),
        ("message", "completed"),
    ]
    assert final.max_tool_calls == 2
    assert final.output_text == "done"


def test_non_streaming_sdk_create_and_retrieve(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    gw.script(call("web_search", args(queries=["sdk"])))
    gw.script(text("answer"))
    created = gw.client.responses.create(
        model="m", input="x", tools=[{"type": "web_search"}], include=["web_search_call.action.sources"]
    )
    assert created.output[0].type == "web_search_call"
    assert created.output[0].action.sources[0].url == "https://example.com/sdk/1"  # type: ignore[union-attr]
    retrieved = gw.client.responses.retrieve(created.id)
    assert retrieved.output == created.output
    items = gw.client.responses.input_items.list(created.id)
    assert [i.type for i in items.data] == ["message"]


def test_background_responses_run_the_tool_loop(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    gw.script(call("web_search", args(queries=["bg"])))
    gw.script(text("background answer"))
    created = gw.client.responses.create(
        model="m", input="x", tools=[{"type": "web_search"}], background=True
    )
    deadline = time.monotonic() + 20
    body: dict[str, object] = {}
    while time.monotonic() < deadline:
        body = httpx.get(f"{gw.url}/v1/responses/{created.id}").json()
        if body["status"] == "completed":
            break
        time.sleep(0.05)
    assert body["status"] == "completed"
    assert [i["type"] for i in body["output"]] == ["web_search_call", "message"]  # type: ignore[index]
    with gw.client.responses.retrieve(created.id, stream=True) as stream:
        kinds = [e.type for e in stream]
    assert "response.web_search_call.searching" in kinds and kinds[-1] == "response.completed"


def test_the_models_view_is_stored_but_never_returned(tools_gw: ToolsGateway) -> None:
    gw = tools_gw
    conv = gw.client.conversations.create()
    gw.script(call("web_search", args(queries=["kept"]), call_id="call_kept"))
    gw.script(text("first"))
    first = gw.create(
        {"model": "m", "input": "x", "tools": [{"type": "web_search"}], "conversation": conv.id}
    )
    # Every route that returns items returns the public item only.
    raw_items = httpx.get(f"{gw.url}/v1/conversations/{conv.id}/items", params={"order": "asc"}).json()[
        "data"
    ]
    assert [i["type"] for i in raw_items] == ["message", "web_search_call", "message"]
    assert all("_gateway" not in i for i in raw_items)
    item_id = raw_items[1]["id"]
    one = httpx.get(f"{gw.url}/v1/conversations/{conv.id}/items/{item_id}").json()
    assert one == first["output"][0] and "_gateway" not in one
    gw.script(text("second"))
    second = gw.create(
        {"model": "m", "input": "again", "tools": [{"type": "web_search"}], "conversation": conv.id}
    )
    listed = httpx.get(f"{gw.url}/v1/responses/{second['id']}/input_items", params={"order": "asc"}).json()[
        "data"
    ]
    assert [i["type"] for i in listed] == ["message", "web_search_call", "message", "message"]
    assert all("_gateway" not in i for i in listed)
    # The model got the stored results text again in the next turn.
    seen = model_input(gw, 2)
    assert {"call": ("web_search", args(queries=["kept"]), "call_kept")} in seen
    output = next(s["output"][1] for s in seen if "output" in s)
    assert "kept result 1" in output
