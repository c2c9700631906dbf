"""Multi-agent responses (beta) against the scripted upstream: the refusals, the coordinator's
collaboration tools, attribution on every item and event (checked against the SDK's beta types),
the concurrency limit, client calls from a subagent, and the stored agent tree."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest
from openai.types.beta.beta_response_output_item import BetaResponseOutputItem
from openai.types.beta.beta_response_stream_event import BetaResponseStreamEvent
from pydantic import TypeAdapter

from responses_app.models import Response
from tests.responses.conftest import Gateway, _sdk_view, sse_events
from tests.responses.scripts import Script, call, handler, path_for, text
from tests.responses.wsutil import Client, connect, create

pytestmark = pytest.mark.django_db(transaction=True)

EVENTS: TypeAdapter[Any] = TypeAdapter(BetaResponseStreamEvent)
ITEMS: TypeAdapter[Any] = TypeAdapter(BetaResponseOutputItem)
MA = {"enabled": True}
FN = {
    "type": "function",
    "name": "lookup",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
}


def _args(**kw: Any) -> str:
    return orjson.dumps(kw).decode()


def tool_names(body: dict[str, Any]) -> set[str]:
    names = set()
    for tool in body.get("tools") or ():
        names.add(tool.get("name") or (tool.get("function") or {}).get("name"))
    return names


def body_text(body: dict[str, Any]) -> str:
    return orjson.dumps(body.get("input") or body.get("messages")).decode()


def task_of(body: dict[str, Any]) -> str | None:
    """The task a subagent's request carries (the root's spawn message), or None for the root."""
    if "spawn_agent" in tool_names(body):
        return None
    found = re.findall(r"\[message from /root\]\\n([A-Za-z0-9 _-]+)", body_text(body))
    return found[-1] if found else "?"


Router = Callable[[dict[str, Any]], Script]


def route(gw: Gateway, router: Router, count: int, wrap: Callable[[Any], Any] | None = None) -> None:
    """Queue ``count`` upstream answers, each chosen by ``router`` from the request body."""

    async def answer(request: Any, rec: Any) -> Any:
        script = router(rec.json())
        return await handler(script, gw.wire)(request, rec)

    gw.upstream.scripts[path_for(gw.wire)].clear()  # leftovers of an earlier response
    for _ in range(count):
        gw.upstream.script(path_for(gw.wire), wrap(answer) if wrap else answer)


def two_subagents(body: dict[str, Any]) -> Script:
    task = task_of(body)
    if task is not None:
        return Script([text(f"answer to {task}")])
    seen = body_text(body)
    if "Spawned" not in seen:
        return Script(
            [
                call("spawn_agent", _args(task_name="a", message="task A")),
                call("spawn_agent", _args(task_name="b", message="task B", fork_turns="none")),
                call("wait_agent", _args(timeout_ms=20000)),
            ],
            service_tier="default",
        )
    if "answer to task A" in seen and "answer to task B" in seen:
        return Script([text("both done")], service_tier="priority")
    return Script([call("wait_agent", _args(timeout_ms=20000))], service_tier="flex")


def check_attribution(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Every event carries an agent and parses as the SDK's beta event; numbering is one stream."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    added: dict[int, str] = {}
    for event in events:
        assert re.fullmatch(r"/root(/[A-Za-z0-9_-]+)?", event["agent"]["agent_name"]), event
        parsed = EVENTS.validate_python(_sdk_view(event))
        assert parsed.agent is not None and parsed.agent.agent_name == event["agent"]["agent_name"]
        if event["type"] == "response.output_item.added":
            assert event["output_index"] not in added
            added[event["output_index"]] = event["item"]["id"]
            assert event["item"]["agent"] == event["agent"]
        elif "output_index" in event:
            assert event["output_index"] in added, event
            if "item_id" in event:
                assert added[event["output_index"]] == event["item_id"]
    final = events[-1]["response"]
    assert [item["id"] for item in final["output"]] == [added[i] for i in sorted(added)]
    for item in final["output"]:
        parsed = ITEMS.validate_python(item)
        assert parsed.agent is not None and parsed.agent.agent_name == item["agent"]["agent_name"]
    return final


# --- refusals ------------------------------------------------------------------------------------

REFUSALS: list[tuple[dict[str, Any], str, str]] = [
    ({"multi_agent": {"enabled": True}, "store": False}, "invalid_value", "store"),
    ({"multi_agent": {"enabled": True}, "max_tool_calls": 3}, "unsupported_parameter", "max_tool_calls"),
    (
        {"multi_agent": {"enabled": True}, "reasoning": {"summary": "auto"}},
        "unsupported_parameter",
        "reasoning.summary",
    ),
    ({"multi_agent": {"enabled": True}, "background": True}, "unsupported_parameter", "background"),
    (
        {"multi_agent": {"enabled": True, "max_concurrent_subagents": 0}},
        "invalid_value",
        "multi_agent.max_concurrent_subagents",
    ),
    (
        {"multi_agent": {"enabled": True, "max_concurrent_subagents": "2"}},
        "invalid_value",
        "multi_agent.max_concurrent_subagents",
    ),
    ({"multi_agent": {"max_concurrent_subagents": 2}}, "missing_required_parameter", "multi_agent.enabled"),
    ({"multi_agent": {"enabled": True, "x": 1}}, "unknown_parameter", "multi_agent.x"),
    ({"multi_agent": True}, "invalid_type", "multi_agent"),
]


@pytest.mark.parametrize("wire", ["responses"])
@pytest.mark.parametrize(("fields", "code", "param"), REFUSALS)
@pytest.mark.parametrize("stream", [False, True])
def test_refusals(gw: Gateway, fields: dict[str, Any], code: str, param: str, stream: bool) -> None:
    before = Response.objects.count()
    r = gw.post({"model": "m", "input": "hi", "stream": stream, **fields})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code
    assert r.json()["error"]["param"] == param
    assert gw.upstream_bodies() == []
    assert Response.objects.count() == before


# The WebSocket refusal: tests/responses/test_websocket.py ("ma", multi_agent).


@pytest.mark.parametrize("wire", ["responses"])
def test_async_tools_with_parallel_tool_calls_get_openai_s_recorded_refusal(gw: Gateway) -> None:
    r = gw.post(
        {
            "model": "m",
            "input": "hi",
            "multi_agent": MA,
            "parallel_tool_calls": True,
            "tools": [{**FN, "async": True}],
        }
    )
    assert r.status_code == 400, r.text
    # OpenAI's answer, recorded by the reference (its async-tool cassettes, multi-agent-parallel).
    assert r.json()["error"] == {
        "message": "Async parallel tool calls are not yet supported in multi-agent mode.",
        "type": "invalid_request_error",
        "param": "multi_agent",
        "code": "unsupported_value",
    }
    assert gw.upstream_bodies() == []


# A continuation of a multi-agent response runs in multi-agent mode: the same refusals.
CONTINUATION_REFUSALS: list[tuple[dict[str, Any], str, str]] = [
    ({"max_tool_calls": 3}, "unsupported_parameter", "max_tool_calls"),
    ({"reasoning": {"summary": "auto"}}, "unsupported_parameter", "reasoning.summary"),
    ({"reasoning": {"generate_summary": "concise"}}, "unsupported_parameter", "reasoning.generate_summary"),
    ({"parallel_tool_calls": True, "tools": [{**FN, "async": True}]}, "unsupported_value", "multi_agent"),
    ({"store": False}, "invalid_value", "store"),
    ({"background": True}, "unsupported_parameter", "background"),
    ({"input": [{"type": "compaction_trigger"}]}, "unsupported_parameter", "input[0]"),
]


@pytest.mark.parametrize("wire", ["responses"])
def test_a_continuation_gets_the_refusals_of_a_fresh_multi_agent_request(gw: Gateway) -> None:
    route(gw, lambda body: Script([text("hello")]), 1)
    first = gw.post({"model": "m", "input": "hi", "multi_agent": MA}).json()
    assert first["status"] == "completed", first
    count, rows = len(gw.upstream_bodies()), Response.objects.count()
    for fields, code, param in CONTINUATION_REFUSALS:
        body = {"model": "m", "previous_response_id": first["id"], "input": "more", **fields}
        for stream in (False, True):
            r = gw.post({**body, "stream": stream})
            assert r.status_code == 400, (fields, r.text)
            assert (r.json()["error"]["code"], r.json()["error"]["param"]) == (code, param), fields
    assert len(gw.upstream_bodies()) == count and Response.objects.count() == rows


def test_multi_agent_is_never_forwarded_upstream(gw: Gateway) -> None:
    route(gw, two_subagents, 8)
    final = gw.post(
        {
            "model": "m",
            "input": "do two things",
            "multi_agent": {"enabled": True, "max_concurrent_subagents": 2},
        }
    ).json()
    assert final["status"] == "completed", final
    bodies = gw.upstream_bodies()
    assert len(bodies) >= 4 and {task_of(b) for b in bodies} >= {None, "task A", "task B"}
    assert [b for b in bodies if "multi_agent" in b] == []


# --- the coordinator -----------------------------------------------------------------------------


def test_root_spawns_two_subagents_then_answers(gw: Gateway) -> None:
    route(gw, two_subagents, 8)
    events = sse_events(
        httpx.post(
            f"{gw.url}/v1/responses",
            json={"model": "m", "input": "do two things", "multi_agent": MA, "stream": True},
            headers={"OpenAI-Beta": "responses_multi_agent=v1"},
            timeout=30,
        )
    )
    final = check_attribution(events)
    assert final["status"] == "completed"
    assert final["service_tier"] == "priority"  # the last root round's tier, not a child's
    by_agent: dict[str, list[str]] = {}
    for item in final["output"]:
        by_agent.setdefault(item["agent"]["agent_name"], []).append(item["type"])
    assert set(by_agent) == {"/root", "/root/a", "/root/b"}
    assert by_agent["/root/a"] == ["message", "agent_message"]
    assert by_agent["/root/b"] == ["message", "agent_message"]
    calls = [i for i in final["output"] if i["type"] == "multi_agent_call"]
    outputs = [i for i in final["output"] if i["type"] == "multi_agent_call_output"]
    assert [c["action"] for c in calls][:3] == ["spawn_agent", "spawn_agent", "wait_agent"]
    assert {o["call_id"] for o in outputs} == {c["call_id"] for c in calls}
    assert all(c["id"].startswith("mac_") for c in calls)
    assert all(o["id"].startswith("maco_") for o in outputs)
    mail = [i for i in final["output"] if i["type"] == "agent_message"]
    assert all(m["id"].startswith("amsg_") for m in mail)
    assert {(m["author"], m["recipient"]) for m in mail} == {
        ("/root", "/root/a"),
        ("/root", "/root/b"),
        ("/root/a", "/root"),
        ("/root/b", "/root"),
    }
    assert final["output"][-1]["type"] == "message"
    assert final["output"][-1]["agent"] == {"agent_name": "/root"}
    # The collaboration tools are the root's alone, and never reach the client as function calls.
    bodies = gw.upstream_bodies()
    subagent_bodies = [b for b in bodies if task_of(b) is not None]
    assert len(subagent_bodies) == 2
    assert all(not (tool_names(b) & {"spawn_agent", "wait_agent"}) for b in subagent_bodies)
    forked = next(b for b in subagent_bodies if task_of(b) == "task A")
    assert "do two things" in body_text(forked)  # fork_turns "all" (the default)
    unforked = next(b for b in subagent_bodies if task_of(b) == "task B")
    assert "do two things" not in body_text(unforked)
    assert not any(i["type"] == "function_call" for i in final["output"])
    # GET returns the terminal snapshot; the tree is stored with it.
    got = httpx.get(f"{gw.url}/v1/responses/{final['id']}", timeout=10).json()
    assert got["output"] == final["output"]
    tree = Response.objects.get(id=final["id"]).agent_tree
    assert tree["version"] == 1 and tree["config"] == {"enabled": True, "max_concurrent_subagents": 3}
    assert {a["name"]: a["status"] for a in tree["agents"]} == {
        "/root": "completed",
        "/root/a": "completed",
        "/root/b": "completed",
    }


def test_json_response_carries_the_same_attributed_output(gw: Gateway) -> None:
    route(gw, two_subagents, 8)
    r = gw.client.beta.responses.create(
        model="m", input="do two things", multi_agent={"enabled": True}, betas=["responses_multi_agent=v1"]
    )
    assert gw.upstream.requests[-1].headers.get("openai-beta") is None  # the gateway's, not upstream's
    assert r.status == "completed"
    assert {i.agent.agent_name for i in r.output} == {"/root", "/root/a", "/root/b"}
    assert r.output[-1].type == "message"


def forced_spawn(body: dict[str, Any]) -> Script:
    task = task_of(body)
    if task is not None:
        return Script([text(f"answer to {task}")])
    if "task A" not in body_text(body):  # the root's first round
        # A strict call: every property present, the optional one null (its default).
        return Script([call("spawn_agent", _args(task_name="a", message="task A", fork_turns=None))])
    return Script([text("done")])


def test_a_named_tool_choice_forces_a_strict_spawn_agent_upstream(gw: Gateway) -> None:
    """``tool_choice`` naming ``spawn_agent`` reaches the upstream in its wire's named form, with the
    collaboration tools declared ``strict`` (all properties required, optional ones nullable, no
    others): a guided upstream then writes schema-valid arguments. vLLM 0.32 pins a forced call's
    arguments to the schema only for a ``strict: true`` tool (tests/inference/test_multi_agent.py)."""
    route(gw, forced_spawn, 3)
    r = gw.post(
        {
            "model": "m",
            "input": "do one thing",
            "multi_agent": MA,
            "tool_choice": {"type": "function", "name": "spawn_agent"},
        }
    )
    assert r.status_code == 200, r.text
    final = r.json()
    assert final["status"] == "completed"
    outputs = [i["output"][0]["text"] for i in final["output"] if i["type"] == "multi_agent_call_output"]
    assert outputs == ["Spawned /root/a (running)."]  # fork_turns null: the default, "all"
    bodies = gw.upstream_bodies()
    root_bodies = [b for b in bodies if task_of(b) is None]
    (child,) = [b for b in bodies if task_of(b) is not None]
    assert "do one thing" in body_text(child)  # forked with "all"
    assert len(root_bodies) == 2
    for body in root_bodies:
        if gw.wire == "responses":
            assert body["tool_choice"] == {"type": "function", "name": "spawn_agent"}
            declared = {t["name"]: t for t in body["tools"]}
        else:
            assert body["tool_choice"] == {"type": "function", "function": {"name": "spawn_agent"}}
            declared = {t["function"]["name"]: t["function"] for t in body["tools"]}
        assert set(declared) == {
            "spawn_agent",
            "send_message",
            "followup_task",
            "wait_agent",
            "interrupt_agent",
            "list_agents",
        }
        for tool in declared.values():
            params = tool["parameters"]
            assert tool["strict"] is True, tool
            assert params["additionalProperties"] is False
            assert sorted(params["required"]) == sorted(params["properties"])
        spawn = declared["spawn_agent"]["parameters"]["properties"]
        assert spawn["fork_turns"] == {"type": ["string", "null"], "enum": ["all", "none", None]}
        assert declared["wait_agent"]["parameters"]["properties"]["timeout_ms"]["type"] == ["integer", "null"]
    # A subagent lacks the collaboration tools: the named choice does not bind it.
    assert "tools" not in child and child.get("tool_choice") in (None, "auto")


def wait_and_interrupt(body: dict[str, Any]) -> Script:
    task = task_of(body)
    if task == "slow":
        return Script([text("slow answer")], delay_s=60)  # interrupted long before
    if task is not None:
        return Script([text(f"answer to {task}")])
    seen = body_text(body)
    if "Spawned" not in seen:
        return Script(
            [
                call("spawn_agent", _args(task_name="slow", message="slow", fork_turns="none")),
                call("spawn_agent", _args(task_name="quick", message="quick", fork_turns="none")),
                call("wait_agent", _args()),
            ]
        )
    if "Interrupted" not in seen:
        return Script([call("interrupt_agent", _args(target="slow")), call("list_agents", _args())])
    return Script([text("done")])


@pytest.mark.parametrize("wire", ["responses"])
def test_wait_agent_then_interrupt_agent(gw: Gateway) -> None:
    route(gw, wait_and_interrupt, 6)
    events = gw.stream({"model": "m", "input": "go", "multi_agent": MA})
    final = check_attribution(events)
    assert final["status"] == "completed"
    outputs = {
        o["action"]: o["output"][0]["text"] for o in final["output"] if o["type"] == "multi_agent_call_output"
    }
    assert "/root/quick: answer to quick" in outputs["wait_agent"]  # the wait ended with the mail
    assert outputs["interrupt_agent"] == "Interrupted /root/slow."
    assert "/root/slow (interrupted)" in outputs["list_agents"]
    assert "/root/quick (completed)" in outputs["list_agents"]
    assert not any(
        i["agent"]["agent_name"] == "/root/slow" and i["type"] == "message" for i in final["output"]
    )
    tree = Response.objects.get(id=final["id"]).agent_tree
    assert {a["name"]: a["status"] for a in tree["agents"]}["/root/slow"] == "interrupted"


@pytest.mark.parametrize("wire", ["responses"])
def test_the_round_cap_ends_the_roots_turn_incomplete(gw: Gateway, gateway_config: Any) -> None:
    """``[responses] max_rounds`` bounds each agent's turn across its segments: a root that calls
    ``list_agents`` every round is stopped after the cap, and the response is incomplete."""
    gateway_config(responses__max_rounds=3)
    route(gw, lambda body: Script([call("list_agents", _args())]), 5)
    final = check_attribution(gw.stream({"model": "m", "input": "go", "multi_agent": MA}))
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [i["type"] for i in final["output"]] == ["multi_agent_call", "multi_agent_call_output"] * 3
    assert len(gw.upstream_bodies()) == 3
    assert Response.objects.get(id=final["id"]).status == "incomplete"


@pytest.mark.parametrize("wire", ["responses"])
def test_wait_agent_waits_at_most_the_cap(gw: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``wait_agent`` asking for longer than the cap (``MAX_WAIT_MS``, here 0.3 s instead of five
    minutes) times out at the cap: the root goes on while its subagent is still at work."""
    from responses_app.features import multi_agent

    monkeypatch.setattr(multi_agent, "MAX_WAIT_MS", 300)

    def router(body: dict[str, Any]) -> Script:
        if task_of(body) is not None:
            return Script([text("late answer")], delay_s=0.5)  # about 3 s: a few events, each late
        if "Spawned" not in body_text(body):
            return Script(
                [
                    call("spawn_agent", _args(task_name="slow", message="slow", fork_turns="none")),
                    call("wait_agent", _args(timeout_ms=3_600_000)),
                ]
            )
        return Script([text("went on")])

    route(gw, router, 3)
    final = check_attribution(gw.stream({"model": "m", "input": "go", "multi_agent": MA}))
    assert final["status"] == "completed"
    outputs = {
        o["action"]: o["output"][0]["text"] for o in final["output"] if o["type"] == "multi_agent_call_output"
    }
    assert outputs["wait_agent"] == "Timed out waiting.\nAgents: /root/slow (running)"
    root_says = [i for i in final["output"] if i["type"] == "message" and i["agent"]["agent_name"] == "/root"]
    assert root_says[0]["content"][0]["text"] == "went on"


@pytest.mark.parametrize("wire", ["responses"])
def test_two_async_rounds_in_a_row_end_an_agents_turn(tools_gw: Gateway) -> None:
    """The async rule per agent: a round whose only client calls are async goes on with the call
    pending, once; after the second such round in a row the agent's turn ends, even when that
    round also ran a gateway tool (no third round)."""
    gw = tools_gw

    def router(body: dict[str, Any]) -> Script:
        seen = body_text(body)
        if "call_a2" in seen:
            return Script([text("a third round")])
        if "call_a1" in seen:
            return Script(
                [call("lookup", _args(q="q2"), call_id="call_a2"), call("web_search", _args(queries=["w"]))]
            )
        return Script([call("lookup", _args(q="q1"), call_id="call_a1")])

    route(gw, router, 3)
    tools = [ASYNC_FN, {"type": "web_search"}]
    # check_attribution: the gateway tool's item (web_search_call) is the agent's too.
    final = check_attribution(gw.stream({"model": "m", "input": "go", "tools": tools, "multi_agent": MA}))
    assert final["status"] == "completed", final
    calls = [i for i in final["output"] if i["type"] == "function_call"]
    assert [(c["call_id"], c["async"]) for c in calls] == [("call_a1", True), ("call_a2", True)]
    assert [i["type"] for i in final["output"] if i["type"] == "web_search_call"] == ["web_search_call"]
    assert not any(i["type"] == "message" for i in final["output"])
    assert len(gw.upstream_bodies()) == 2


@pytest.mark.parametrize("wire", ["responses"])
def test_max_concurrent_subagents_is_respected(gw: Gateway) -> None:
    def router(body: dict[str, Any]) -> Script:
        task = task_of(body)
        if task is not None:
            return Script([text(f"answer to {task}")])
        seen = body_text(body)
        if "Spawned" not in seen:
            spawns = [
                call("spawn_agent", _args(task_name=f"t{n}", message=f"t{n}", fork_turns="none"))
                for n in range(4)
            ]
            return Script([*spawns, call("wait_agent", _args())])
        if all(f"answer to t{n}" in seen for n in range(4)):
            return Script([text("all four")])
        return Script([call("wait_agent", _args())])

    # Each subagent request holds until 3 subagent requests are in flight (or 1.5 s): with a limit
    # of 2, at most 2 ever overlap; without the limit, all 4 would.
    flight = {"now": 0, "peak": 0}

    def hold(inner: Any) -> Any:
        async def held(request: Any, rec: Any) -> Any:
            if task_of(rec.json()) is None:
                return await inner(request, rec)
            flight["now"] += 1
            flight["peak"] = max(flight["peak"], flight["now"])
            try:
                deadline = time.monotonic() + 1.5
                while flight["now"] < 3 and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)
                return await inner(request, rec)
            finally:
                flight["now"] -= 1

        return held

    route(gw, router, 12, wrap=hold)
    events = gw.stream(
        {"model": "m", "input": "go", "multi_agent": {"enabled": True, "max_concurrent_subagents": 2}}
    )
    final = check_attribution(events)
    assert final["status"] == "completed" and final["output"][-1]["content"][0]["text"] == "all four"
    assert flight["peak"] == 2
    spawned = [
        o["output"][0]["text"]
        for o in final["output"]
        if o["action" if "action" in o else "type"] == "spawn_agent"
        and o["type"] == "multi_agent_call_output"
    ]
    assert spawned[2:] == ["Spawned /root/t2 (queued).", "Spawned /root/t3 (queued)."]


# --- client calls, continuation, storage ---------------------------------------------------------


def subagent_calls_client(body: dict[str, Any]) -> Script:
    task = task_of(body)
    seen = body_text(body)
    if task is not None:
        if "sunny" in seen:
            return Script([text("it is sunny")])
        return Script([call("lookup", _args(q="weather"), call_id="call_sub1")])
    if "Spawned" not in seen:
        return Script(
            [
                call("spawn_agent", _args(task_name="w", message="weather", fork_turns="none")),
                call("wait_agent", _args()),
            ]
        )
    if "it is sunny" in seen:
        return Script([text("the subagent says sunny")])
    return Script([call("wait_agent", _args())])


def test_client_call_from_subagent_is_answered_in_a_continuation(gw: Gateway) -> None:
    route(gw, subagent_calls_client, 8)
    first = gw.post({"model": "m", "input": "weather?", "tools": [FN], "multi_agent": MA}).json()
    assert first["status"] == "completed", first
    fc = [i for i in first["output"] if i["type"] == "function_call"]
    assert len(fc) == 1 and fc[0]["agent"] == {"agent_name": "/root/w"} and fc[0]["call_id"] == "call_sub1"
    tree = Response.objects.get(id=first["id"]).agent_tree
    entry = next(a for a in tree["agents"] if a["name"] == "/root/w")
    assert entry["status"] == "awaiting_client" and entry["pending_calls"] == ["call_sub1"]

    # The continuation names no multi_agent: it inherits the stored tree's configuration.
    count = len(gw.upstream_bodies())
    second = gw.post(
        {
            "model": "m",
            "previous_response_id": first["id"],
            "tools": [FN],
            "input": [{"type": "function_call_output", "call_id": "call_sub1", "output": "sunny"}],
        }
    ).json()
    assert second["status"] == "completed", second
    assert second["output"][-1]["content"][0]["text"] == "the subagent says sunny"
    later = gw.upstream_bodies()[count:]
    sub = [b for b in later if task_of(b) is not None]
    # The output went to the subagent that made the call (its restored history), not the root.
    assert sub and "call_sub1" in body_text(sub[0]) and "sunny" in body_text(sub[0])
    roots = [b for b in later if task_of(b) is None]
    assert all('"output":"sunny"' not in body_text(b) for b in roots)
    assert Response.objects.get(id=second["id"]).agent_tree["config"]["max_concurrent_subagents"] == 3
    # Owner isolation: the tree is another owner's once the row is; it is "not found" to us.
    Response.objects.filter(id=second["id"]).update(owner="oidc:someone-else")
    other = gw.post({"model": "m", "previous_response_id": second["id"], "input": "hi"})
    assert other.status_code == 400, other.text
    assert other.json()["error"]["code"] == "previous_response_not_found"
    assert httpx.get(f"{gw.url}/v1/responses/{second['id']}", timeout=10).status_code == 404


def test_continuation_restores_the_tree(gw: Gateway) -> None:
    route(gw, two_subagents, 8)
    first = gw.post(
        {
            "model": "m",
            "input": "do two things",
            "multi_agent": {"enabled": True, "max_concurrent_subagents": 1},
        }
    ).json()
    assert first["status"] == "completed"

    def followup(body: dict[str, Any]) -> Script:
        task = task_of(body)
        if task is not None:
            return Script([text(f"again {task}")])
        seen = body_text(body)
        if "followup_task" not in seen:
            return Script(
                [call("followup_task", _args(target="a", message="more")), call("wait_agent", _args())]
            )
        return Script([text("followed up")])

    count = len(gw.upstream_bodies())
    route(gw, followup, 4)
    second = gw.post({"model": "m", "previous_response_id": first["id"], "input": "again"}).json()
    assert second["status"] == "completed", second
    later = gw.upstream_bodies()[count:]
    sub = [b for b in later if task_of(b) is not None]
    # /root/a continues its own history: its earlier task and answer, then the follow-up.
    assert len(sub) == 1 and "answer to task A" in body_text(sub[0]) and "more" in body_text(sub[0])
    assert "answer to task B" not in body_text(sub[0])
    tree = Response.objects.get(id=second["id"]).agent_tree
    assert tree["config"]["max_concurrent_subagents"] == 1
    assert {a["name"] for a in tree["agents"]} == {"/root", "/root/a", "/root/b"}


# --- per-agent compaction ------------------------------------------------------------------------

LONG = [
    {"role": "user", "content": "A" * 400},
    {"role": "assistant", "content": "B" * 400},
    {"role": "user", "content": "C" * 40},
]


def compacting(body: dict[str, Any]) -> Script:
    if body.get("stream") is False:  # a summary round
        return Script([text("SUMMARY of " + ("sub" if "task X" in body_text(body) else "root"))])
    task = task_of(body)
    if task is not None:
        return Script([text(f"answer to {task}")])
    seen = body_text(body)
    if "Spawned" not in seen:
        return Script(
            [call("spawn_agent", _args(task_name="x", message="task X")), call("wait_agent", _args())]
        )
    return Script([text("done")])


def test_each_agent_compacts_itself_over_the_threshold(gw: Gateway) -> None:
    route(gw, compacting, 8)
    events = gw.stream(
        {
            "model": "m",
            "input": LONG,
            "multi_agent": MA,
            # Over the history's estimate for the root and its forked subagent, not after compacting.
            "context_management": [{"type": "compaction", "compact_threshold": 200}],
        }
    )
    final = check_attribution(events)
    assert final["status"] == "completed", final
    compactions = [i for i in final["output"] if i["type"] == "compaction"]
    assert {i["agent"]["agent_name"]: i["encrypted_content"] for i in compactions} == {
        "/root": "SUMMARY of root",
        "/root/x": "SUMMARY of sub",
    }
    bodies = [b for b in gw.upstream_bodies() if b.get("stream") is not False]
    sub = next(b for b in bodies if task_of(b) is not None)
    assert "SUMMARY of sub" in body_text(sub) and "B" * 400 not in body_text(sub)


@pytest.mark.parametrize("wire", ["responses"])
def test_a_subagent_at_work_finishes_its_turn_after_the_root_answers(gw: Gateway) -> None:
    answered = {"root": False}

    def router(body: dict[str, Any]) -> Script:
        task = task_of(body)
        if task is not None:
            return Script([text("late answer")])
        if "Spawned" not in body_text(body):
            return Script([call("spawn_agent", _args(task_name="late", message="late", fork_turns="none"))])
        answered["root"] = True
        return Script([text("root done")])

    def hold(inner: Any) -> Any:
        async def held(request: Any, rec: Any) -> Any:
            if task_of(rec.json()) is not None:  # the subagent answers only after the root did
                deadline = time.monotonic() + 10
                while not answered["root"] and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)
            return await inner(request, rec)

        return held

    route(gw, router, 4, wrap=hold)
    final = check_attribution(gw.stream({"model": "m", "input": "go", "multi_agent": MA}))
    assert final["status"] == "completed"
    kinds = [(i["type"], i["agent"]["agent_name"]) for i in final["output"]]
    assert kinds.index(("message", "/root")) < kinds.index(("message", "/root/late"))
    assert kinds[-1] == ("agent_message", "/root/late")  # mail for the root's next turn
    tree = Response.objects.get(id=final["id"]).agent_tree
    assert {a["name"]: a["status"] for a in tree["agents"]} == {
        "/root": "completed",
        "/root/late": "completed",
    }


@pytest.mark.parametrize("wire", ["responses"])
def test_websocket_refuses_to_continue_a_multi_agent_response(gw: Gateway) -> None:
    route(gw, two_subagents, 8)
    first = gw.post({"model": "m", "input": "do two things", "multi_agent": MA}).json()
    count = len(gw.upstream_bodies())

    async def scenario() -> dict[str, Any]:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(previous_response_id=first["id"], input="more"))
            answer: dict[str, Any] = await c.recv()
            return answer

    error = asyncio.run(scenario())
    assert error["type"] == "error" and error["status"] == 400
    assert error["error"]["param"] == "previous_response_id"
    assert error["error"]["code"] == "unsupported_parameter"
    assert len(gw.upstream_bodies()) == count


@pytest.mark.parametrize("wire", ["responses"])
def test_a_failed_root_round_fails_the_response_and_stores_it_failed(gw: Gateway) -> None:
    gw.script(error_status=400, error_message="bad prompt")
    r = gw.post({"model": "m", "input": "go", "multi_agent": MA})
    assert r.status_code == 400 and "bad prompt" in r.json()["error"]["message"]
    row = Response.objects.get()
    assert row.status == "failed" and row.agent_tree["agents"][0]["name"] == "/root"


# --- async client tools in multi-agent mode ------------------------------------------------------

ASYNC_FN = {**FN, "async": True}
PENDING = "is running in the background"  # the pending-call note the model reads


def async_agents(body: dict[str, Any]) -> Script:
    """The root calls the async tool, then spawns /root/w, which calls it too; neither waits."""
    task = task_of(body)
    seen = body_text(body)
    if task is not None:
        if "sunny" in seen:
            return Script([text("it is sunny")])
        if "call_s1" in seen:
            return Script([text("lookup started")])
        return Script([call("lookup", _args(q="sub"), call_id="call_s1")])
    if "rootval" in seen:
        return Script([text("root got rootval")])
    if "it is sunny" in seen:
        return Script([text("root knows sunny")])
    if "lookup started" in seen:
        return Script([text("root done")])
    if "Spawned" in seen:
        return Script([call("wait_agent", _args(timeout_ms=20000))])
    if "call_r1" in seen:
        return Script(
            [
                call("spawn_agent", _args(task_name="w", message="weather", fork_turns="none")),
                call("wait_agent", _args(timeout_ms=20000)),
            ]
        )
    return Script([call("lookup", _args(q="root"), call_id="call_r1")])


def _async_first(gw: Gateway) -> dict[str, Any]:
    route(gw, async_agents, 8)
    return check_attribution(
        gw.stream({"model": "m", "input": "weather?", "tools": [ASYNC_FN], "multi_agent": MA})
    )


def test_async_calls_in_multi_agent_mode_continue_with_the_call_pending(gw: Gateway) -> None:
    final = _async_first(gw)
    assert final["status"] == "completed", final
    calls = {i["call_id"]: i for i in final["output"] if i["type"] == "function_call"}
    assert set(calls) == {"call_r1", "call_s1"}
    assert calls["call_r1"]["async"] is True and calls["call_r1"]["agent"] == {"agent_name": "/root"}
    assert calls["call_s1"]["async"] is True and calls["call_s1"]["agent"] == {"agent_name": "/root/w"}
    assert final["output"][-1]["content"][0]["text"] == "root done"
    # Each agent's model read the note for its own pending call (and only its own).
    bodies = gw.upstream_bodies()
    sub = [b for b in bodies if task_of(b) is not None]
    assert len(sub) == 2 and PENDING in body_text(sub[1]) and "call_s1" in body_text(sub[1])
    assert "call_r1" not in body_text(sub[1])
    roots = [b for b in bodies if task_of(b) is None]
    assert PENDING in body_text(roots[1]) and "call_r1" in body_text(roots[1])
    assert all("call_s1" not in body_text(b) for b in roots)
    tree = Response.objects.get(id=final["id"]).agent_tree
    assert {a["name"]: a["status"] for a in tree["agents"]} == {"/root": "completed", "/root/w": "completed"}


def test_a_late_async_output_wakes_its_agent_in_a_continuation(gw: Gateway) -> None:
    first = _async_first(gw)
    # The subagent's call: /root/w (which finished its turn) runs a new turn with the output; its
    # answer reaches the root as mail, and the root's new turn reads it.
    count = len(gw.upstream_bodies())
    route(gw, async_agents, 4)
    output = {"type": "function_call_output", "call_id": "call_s1", "output": "sunny-42"}
    second = check_attribution(
        gw.stream({"model": "m", "previous_response_id": first["id"], "tools": [ASYNC_FN], "input": [output]})
    )
    assert second["status"] == "completed", second
    kinds = [(i["type"], i["agent"]["agent_name"]) for i in second["output"]]
    assert kinds == [
        ("message", "/root/w"),
        ("agent_message", "/root/w"),
        ("message", "/root"),
    ], kinds
    assert second["output"][-1]["content"][0]["text"] == "root knows sunny"
    later = gw.upstream_bodies()[count:]
    assert [task_of(b) is not None for b in later] == [True, False]
    assert "sunny-42" in body_text(later[0]) and PENDING not in body_text(later[0])
    assert "sunny-42" not in body_text(later[1]) and "it is sunny" in body_text(later[1])
    stored = Response.objects.get(id=second["id"]).agent_tree
    assert {a["name"]: a["status"] for a in stored["agents"]} == {
        "/root": "completed",
        "/root/w": "completed",
    }

    # The root's own call: a new root turn reads the output; the subagent does not run.
    count = len(gw.upstream_bodies())
    route(gw, async_agents, 2)
    third = gw.post(
        {
            "model": "m",
            "previous_response_id": second["id"],
            "tools": [ASYNC_FN],
            "input": [{"type": "function_call_output", "call_id": "call_r1", "output": "rootval"}],
        }
    ).json()
    assert third["status"] == "completed", third
    assert third["output"][-1]["content"][0]["text"] == "root got rootval"
    later = gw.upstream_bodies()[count:]
    assert len(later) == 1 and task_of(later[0]) is None and "rootval" in body_text(later[0])


def test_a_further_output_for_a_client_supplied_async_call_is_refused(gw: Gateway) -> None:
    supplied = {
        "type": "function_call",
        "call_id": "call_c1",
        "name": "lookup",
        "arguments": "{}",
        "async": True,
    }
    answer = {"type": "function_call_output", "call_id": "call_c1", "output": "one"}
    again = {**answer, "output": "two"}
    route(gw, lambda body: Script([text("noted")]), 2)
    base = {"model": "m", "tools": [ASYNC_FN], "multi_agent": MA}
    rows = Response.objects.count()
    # Two outputs in the request that supplies the call: refused, nothing stored.
    r = gw.post({**base, "input": [{"role": "user", "content": "hi"}, supplied, answer, again]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_value" and r.json()["error"]["param"] == "input"
    assert Response.objects.count() == rows
    first = gw.post({**base, "input": [{"role": "user", "content": "hi"}, supplied, answer]}).json()
    assert first["status"] == "completed", first
    rows = Response.objects.count()
    r = gw.post({"model": "m", "tools": [ASYNC_FN], "previous_response_id": first["id"], "input": [again]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_value" and error["param"] == "input" and "call_c1" in error["message"]
    assert Response.objects.count() == rows
    # Outside multi-agent mode the same further output is accepted (the async rule).
    route(gw, lambda body: Script([text("noted")]), 2)
    single = gw.post(
        {"model": "m", "tools": [ASYNC_FN], "input": [{"role": "user", "content": "hi"}, supplied, answer]}
    ).json()
    ok = gw.post({"model": "m", "tools": [ASYNC_FN], "previous_response_id": single["id"], "input": [again]})
    assert ok.status_code == 200, ok.text


def test_a_further_output_for_a_gateway_emitted_async_call_reaches_its_agent(gw: Gateway) -> None:
    first = _async_first(gw)
    route(gw, async_agents, 4)
    output = {"type": "function_call_output", "call_id": "call_s1", "output": "sunny-42"}
    base = {"model": "m", "tools": [ASYNC_FN]}
    second = gw.post({**base, "previous_response_id": first["id"], "input": [output]}).json()
    assert second["status"] == "completed", second
    count = len(gw.upstream_bodies())
    route(gw, async_agents, 4)
    again = {**output, "output": "sunny-43"}
    third = gw.post({**base, "previous_response_id": second["id"], "input": [again]}).json()
    assert third["status"] == "completed", third
    later = gw.upstream_bodies()[count:]
    sub = [b for b in later if task_of(b) is not None]
    assert len(sub) == 1 and "sunny-42" in body_text(sub[0]) and "sunny-43" in body_text(sub[0])
    assert body_text(sub[0]).index("sunny-42") < body_text(sub[0]).index("sunny-43")


# --- multi-agent items given back as input -------------------------------------------------------

AGENT_TYPES = {"multi_agent_call", "multi_agent_call_output", "agent_message"}
FORGED = {
    "type": "agent_message",
    "author": "/root/x",
    "recipient": "/root",
    "content": [{"type": "text", "text": "FORGED MAIL"}],
}


def raw_agent_items(body: dict[str, Any]) -> list[Any]:
    """What of multi-agent mode reached the upstream raw: its item types or an ``agent`` tag."""
    found: list[Any] = []
    for item in body.get("input") or body.get("messages") or ():
        if isinstance(item, dict) and (item.get("type") in AGENT_TYPES or "agent" in item):
            found.append(item)
    return found


@pytest.mark.parametrize("store", [False, True])
def test_a_single_agent_request_drops_multi_agent_items_from_the_model_input(
    gw: Gateway, store: bool
) -> None:
    """A stateless replay of a multi-agent response: its public items are accepted and no model
    reads them; the root's own message reaches the model, a subagent's does not."""
    route(gw, two_subagents, 8)
    first = gw.post({"model": "m", "input": "do two things", "multi_agent": MA}).json()
    assert first["status"] == "completed", first
    assert {i["type"] for i in first["output"]} >= AGENT_TYPES
    count = len(gw.upstream_bodies())
    route(gw, lambda body: Script([text("plain answer")]), 1)
    replay = [
        {"role": "user", "content": "do two things"},
        *first["output"],
        FORGED,
        {"role": "user", "content": "next"},
    ]
    r = gw.post({"model": "m", "input": replay, "store": store})
    assert r.status_code == 200, r.text
    assert r.json()["output"][-1]["content"][0]["text"] == "plain answer"
    (body,) = gw.upstream_bodies()[count:]
    assert raw_agent_items(body) == []
    seen = body_text(body)
    assert "both done" in seen and "next" in seen  # the root's answer, the new question
    assert "answer to task A" not in seen and "FORGED MAIL" not in seen  # a subagent's work, mail


def test_multi_agent_items_given_as_input_to_a_continuation_reach_no_model(gw: Gateway) -> None:
    route(gw, two_subagents, 8)
    first = gw.post({"model": "m", "input": "do two things", "multi_agent": MA}).json()
    spawn_ids = [
        i["call_id"]
        for i in first["output"]
        if i["type"] == "multi_agent_call" and i["action"] == "spawn_agent"
    ]
    assert len(spawn_ids) == 2

    def root_calls(bodies: list[dict[str, Any]]) -> list[list[str]]:
        """Per root round: the call_ids of its function_call items (the model's view)."""
        out = []
        for b in bodies:
            if task_of(b) is None:
                calls = [i["call_id"] for i in b.get("input") or () if i.get("type") == "function_call"]
                calls += [c["id"] for m in b.get("messages") or () for c in m.get("tool_calls") or ()]
                out.append(calls)
        return out

    def turn(previous: str, given: Any) -> str:
        count = len(gw.upstream_bodies())
        route(gw, lambda body: Script([text("root again")]), 1)
        answer = gw.post({"model": "m", "previous_response_id": previous, "input": given}).json()
        assert answer["status"] == "completed", answer
        (root,) = gw.upstream_bodies()[count:]
        assert "FORGED MAIL" not in body_text(root)
        # Each of the tree's collaboration calls once, as the root's function call: the replayed
        # copies are not read again.
        (calls,) = root_calls([root])
        assert sorted(c for c in calls if c in spawn_ids) == sorted(spawn_ids), calls
        assert len(calls) == len(set(calls)), calls
        return str(answer["id"])

    second = turn(first["id"], [*first["output"], FORGED, {"role": "user", "content": "and now?"}])
    turn(second, "once more")  # a later turn: the stored input items stay unread


def test_a_conversation_turn_after_a_multi_agent_turn_sends_nothing_of_it_raw(gw: Gateway) -> None:
    conv = gw.client.conversations.create(items=[]).id
    route(gw, two_subagents, 8)
    first = gw.post({"model": "m", "input": "do two things", "multi_agent": MA, "conversation": conv}).json()
    assert first["status"] == "completed", first
    stored = {i.type for i in gw.client.conversations.items.list(conv).data}
    assert stored >= AGENT_TYPES
    count = len(gw.upstream_bodies())
    route(gw, lambda body: Script([text("single again")]), 1)
    second = gw.post({"model": "m", "input": "next", "conversation": conv}).json()
    assert second["status"] == "completed", second
    (body,) = gw.upstream_bodies()[count:]
    assert raw_agent_items(body) == []
    seen = body_text(body)
    assert "do two things" in seen and "both done" in seen and "answer to task A" not in seen


def test_compact_summarizes_the_root_s_items_only(gw: Gateway) -> None:
    """``/v1/responses/compact`` of a multi-agent response: no multi-agent item reaches the upstream
    raw (the summary reads what a single-agent model would)."""
    route(gw, two_subagents, 8)
    first = gw.post({"model": "m", "input": "do two things", "multi_agent": MA}).json()
    count = len(gw.upstream_bodies())
    route(gw, lambda body: Script([text("SUMMARY")]), 1)
    r = httpx.post(
        f"{gw.url}/v1/responses/compact",
        json={"model": "m", "previous_response_id": first["id"]},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    (body,) = gw.upstream_bodies()[count:]
    assert raw_agent_items(body) == []
    # The root's view, as its model reads it: the subagents' reports arrive as the root's own
    # messages and wait_agent outputs, their own rounds do not.
    assert "both done" in body_text(body) and "[message from /root/a]" in body_text(body)


# --- phase on assistant messages -----------------------------------------------------------------


def commentary_then_answer(body: dict[str, Any]) -> Script:
    task = task_of(body)
    if task is not None:
        return Script([text(f"answer to {task}")])
    if "Spawned" not in body_text(body):  # the root says something, then collaborates
        return Script(
            [
                text("Asking a helper."),
                call("spawn_agent", _args(task_name="a", message="task A", fork_turns="none")),
                call("wait_agent", _args(timeout_ms=20000)),
            ]
        )
    return Script([text("all done")])


@pytest.mark.parametrize("stream", [True, False])
def test_assistant_messages_carry_their_phase(gw: Gateway, stream: bool) -> None:
    """An assistant message that ends its agent's turn is ``final_answer``; one the round goes on
    after (calls follow it) is ``commentary`` (spec: a streamed response can hold a message with
    phase: final_answer followed by the root's next answer). The SDK's beta types parse it."""
    route(gw, commentary_then_answer, 4)
    body = {"model": "m", "input": "go", "multi_agent": MA}
    if stream:
        events = gw.stream(body)
        final = check_attribution(events)
        done = {
            e["item"]["id"]: e["item"].get("phase")
            for e in events
            if e["type"] == "response.output_item.done" and e["item"]["type"] == "message"
        }
        assert done == {i["id"]: i["phase"] for i in final["output"] if i["type"] == "message"}
    else:
        final = gw.post(body).json()
        for item in final["output"]:
            ITEMS.validate_python(item)
    assert final["status"] == "completed", final
    phases = [
        (i["agent"]["agent_name"], i["content"][0]["text"], i["phase"])
        for i in final["output"]
        if i["type"] == "message"
    ]
    assert phases == [
        ("/root", "Asking a helper.", "commentary"),
        ("/root/a", "answer to task A", "final_answer"),
        ("/root", "all done", "final_answer"),
    ]
    stored = httpx.get(f"{gw.url}/v1/responses/{final['id']}", timeout=10).json()
    assert [i.get("phase") for i in stored["output"]] == [i.get("phase") for i in final["output"]]
    # The phase is the gateway's label for the client: the model server never reads it back.
    later = [b for b in gw.upstream_bodies() if task_of(b) is None][1:]
    assert later and all('"phase"' not in orjson.dumps(b).decode() for b in later)
