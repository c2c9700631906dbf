"""Lineages of Responses model rounds (``inference_app.upstream.lineage``), seen where placement
reads them: at send time. ``[routing] session_header`` makes the HTTP upstream send the lineage
as a header, and the scripted upstream records every request's headers.

Covered: the rounds of a tool loop share one; ``previous_response_id`` continuations (over HTTP and
over a WebSocket's connection-local cache) keep it; a conversation's responses share one; a
compaction summary is sent in the lineage it compacts; each multi-agent agent has its own, stable
across a continuation; ``prompt_cache_key`` names one, owner-scoped (the direct path too); a
background response keeps its own.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import httpx
import pytest

from gateway.core.auth import apikeys
from inference_app.upstream import lineage
from responses_app.models import Response
from tests.responses.conftest import Gateway, wait_terminal
from tests.responses.scripts import call, path_for, text
from tests.responses.test_multi_agent import MA, route, task_of, two_subagents
from tests.responses.tool_fixtures import ToolsGateway
from tests.responses.wsutil import Client, connect, create

pytestmark = pytest.mark.django_db(transaction=True)

HEADER = "x-lineage"


@pytest.fixture
def lgw(gw: Gateway, gateway_config: Any) -> Gateway:
    gateway_config(routing__session_header=HEADER)
    return gw


def sent(gw: Gateway) -> list[str | None]:
    """The lineage each model round was sent in, in order (None: none)."""
    return [r.headers.get(HEADER) for r in gw.upstream.requests if r.path == path_for(gw.wire)]


@pytest.mark.parametrize("wire", ["chat_completions"])
def test_tool_rounds_and_continuations_share_one_lineage(tools_gw: ToolsGateway, gateway_config: Any) -> None:
    gw = tools_gw
    gateway_config(routing__session_header=HEADER)
    gw.script(call("web_search", '{"queries": ["asyncio"]}'))
    gw.script(text("asyncio is a library"))
    first = gw.create({"model": "m", "input": "what is asyncio?", "tools": [{"type": "web_search"}]})
    assert [i["type"] for i in first["output"]] == ["web_search_call", "message"]
    gw.script(text("two"))
    second = gw.create({"model": "m", "input": "more", "previous_response_id": first["id"]})
    gw.script(text("three"))
    gw.create({"model": "m", "input": "again", "previous_response_id": second["id"]})
    gw.script(text("another"))
    gw.create({"model": "m", "input": "unrelated"})
    keys = sent(gw)
    assert len(keys) == 5 and all(keys)
    # Both tool rounds, the continuation and the continuation's continuation: one lineage.
    assert keys[0] == keys[1] == keys[2] == keys[3]
    assert keys[4] != keys[0]  # a fresh response starts its own
    assert Response.objects.get(id=second["id"]).lineage == keys[0]  # stored for the next continuation
    assert keys[0] == lineage.key("default", "response", first["id"])


@pytest.mark.parametrize("wire", ["responses"])
def test_no_header_without_the_setting(gw: Gateway) -> None:
    gw.script(text("hi"))
    assert gw.post({"model": "m", "input": "hi"}).status_code == 200
    assert sent(gw) == [None]


@pytest.mark.parametrize("wire", ["responses"])
def test_a_websocket_continuation_of_an_unstored_response_keeps_its_lineage(lgw: Gateway) -> None:
    gw = lgw
    for answer in ("one", "two", "three"):
        gw.script(text(answer))

    async def scenario() -> None:
        async with await connect(gw.url) as ws:
            c = Client(ws)
            await c.send(create(store=False, input="first"))
            rid = (await c.until_terminal())[-1]["response"]["id"]
            for turn in ("second", "third"):  # a continuation, and a continuation of it
                await c.send(create(store=False, previous_response_id=rid, input=turn))
                rid = (await c.until_terminal())[-1]["response"]["id"]

    asyncio.run(scenario())
    first, second, third = sent(gw)
    assert first is not None and first == second == third


@pytest.mark.parametrize("wire", ["responses"])
def test_a_conversations_responses_share_its_lineage(lgw: Gateway) -> None:
    gw = lgw
    conv = gw.client.conversations.create(items=[]).id
    other = gw.client.conversations.create(items=[]).id
    for body in (
        {"conversation": conv, "input": "one"},
        {"conversation": {"id": conv}, "input": "two"},
        {"conversation": other, "input": "three"},
    ):
        gw.script(text("ok"))
        assert gw.post({"model": "m", **body}).status_code == 200
    one, two, three = sent(gw)
    assert one == two == lineage.key("default", "conversation", conv)
    assert three != one


@pytest.mark.parametrize("wire", ["responses"])
def test_prompt_cache_key_names_the_lineage_per_owner(lgw: Gateway) -> None:
    gw = lgw
    alice_key, alice = apikeys.apikey_create(name="alice")
    bob_key, bob = apikeys.apikey_create(name="bob")
    body = {"model": "m", "input": "hi", "prompt_cache_key": "session-1"}
    # Through the executor (stored) and the stateless direct path (store: false), for each owner.
    for secret in (alice, alice, bob):
        for extra in ({}, {"store": False}):
            gw.script(text("ok"))
            r = gw.post({**body, **extra}, headers={"authorization": f"Bearer {secret}"})
            assert r.status_code == 200, r.text
    a1, a2, a3, a4, b1, b2 = sent(gw)
    assert a1 == a2 == a3 == a4 == lineage.key(alice_key.owner, "prompt_cache_key", "session-1")
    assert b1 == b2 == lineage.key(bob_key.owner, "prompt_cache_key", "session-1")
    assert a1 != b1  # the same raw key of two owners never meets
    # The direct path sends no lineage without a prompt_cache_key.
    gw.script(text("ok"))
    r = gw.post({"model": "m", "input": "hi", "store": False}, headers={"authorization": f"Bearer {alice}"})
    assert r.status_code == 200, r.text
    assert sent(gw)[-1] is None


def test_two_owners_same_conversation_like_key_differ() -> None:
    assert lineage.key("key:1", "conversation", "conv_x") != lineage.key("key:2", "conversation", "conv_x")


SUMMARY = "Summary: A, B and C."
HISTORY = [
    {"role": "user", "content": "A" * 400},
    {"role": "assistant", "content": "B" * 400},
    {"role": "user", "content": "C" * 40},
]
ESTIMATE = math.ceil(840 / 4) + 3 * 4 + 3 * 2  # tests/responses/test_compaction_auto.py


@pytest.mark.parametrize("wire", ["chat_completions"])
def test_compaction_summaries_run_in_the_lineage_they_compact(lgw: Gateway) -> None:
    gw = lgw
    gw.script(text("first"))
    first = gw.post({"model": "m", "input": "start"}).json()
    gw.script(text(SUMMARY))
    gw.script(text("answer"))
    managed = [{"type": "compaction", "compact_threshold": ESTIMATE - 1}]
    r = gw.post(
        {"model": "m", "input": HISTORY, "previous_response_id": first["id"], "context_management": managed}
    )
    assert [i["type"] for i in r.json()["output"]] == ["compaction", "message"]
    # The standalone compaction endpoint, of the same chain.
    gw.script(text(SUMMARY))
    compacted = httpx.post(
        f"{gw.url}/v1/responses/compact",
        json={"model": "m", "previous_response_id": r.json()["id"]},
        timeout=30,
    )
    assert compacted.json()["object"] == "response.compaction", compacted.text
    bodies = gw.upstream_bodies()
    keys = sent(gw)
    assert len(bodies) == 4  # the first response, the summary, the answer, the endpoint's summary
    assert len(set(keys)) == 1 and keys[0] is not None


@pytest.mark.parametrize("wire", ["responses"])
def test_each_agent_has_its_own_stable_lineage(lgw: Gateway) -> None:
    gw = lgw
    route(gw, two_subagents, 8)
    first = gw.post({"model": "m", "input": "do two things", "multi_agent": MA}).json()
    assert first["status"] == "completed", first
    count = len(gw.upstream.requests)

    def by_agent(requests: list[Any]) -> dict[str, set[str | None]]:
        out: dict[str, set[str | None]] = {}
        for rec in requests:
            if rec.path == path_for(gw.wire):
                out.setdefault(task_of(rec.json()) or "root", set()).add(rec.headers.get(HEADER))
        return out

    agents = by_agent(gw.upstream.requests)
    assert set(agents) == {"root", "task A", "task B"}
    assert all(len(keys) == 1 and None not in keys for keys in agents.values())  # stable across rounds
    keys = [next(iter(k)) for k in agents.values()]
    assert len(set(keys)) == 3  # distinct per agent
    response_lineage = Response.objects.get(id=first["id"]).lineage
    assert response_lineage not in keys  # no agent is the response's lineage itself
    # A continuation: the root agent's rounds keep the root's lineage.
    gw.upstream.scripts[path_for(gw.wire)].clear()
    gw.script(text("again"))
    second = gw.post({"model": "m", "previous_response_id": first["id"], "input": "again"}).json()
    assert second["status"] == "completed", second
    later = by_agent(gw.upstream.requests[count:])
    assert later == {"root": agents["root"]}


@pytest.mark.parametrize("wire", ["responses"])
def test_a_background_response_keeps_its_lineage(lgw: Gateway) -> None:
    gw = lgw
    gw.script(text("one"))
    first = gw.post({"model": "m", "input": "start"}).json()
    gw.script(text("two"))
    queued = gw.post({"model": "m", "input": "go", "background": True, "previous_response_id": first["id"]})
    assert queued.status_code == 200, queued.text
    assert wait_terminal(queued.json()["id"]).status == "completed"
    one, two = sent(gw)
    assert one is not None and one == two
