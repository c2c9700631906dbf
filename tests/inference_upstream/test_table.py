"""The upstream table against two or three scripted upstreams on loopback ports: model routing, the
union model list, weighted spread, lineage stickiness, the session header, failover before the head
and none after it, back-off and recovery, and /ready and /metrics naming each upstream."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web
from pydantic import SecretStr

from gateway.core import config as config_module
from gateway.core import errors
from gateway.core.config import UpstreamEntry
from gateway.core.metrics import REGISTRY
from inference_app.upstream import lineage
from inference_app.upstream.http import HttpUpstream, close_upstreams, forward_headers, get_upstream
from inference_app.upstream.table import Member, UpstreamTable, rendezvous_score
from tests.servers import LiveServer, free_port
from tests.upstream import Meeting, Recorded, ScriptedUpstream, chat_chunks, hang, json_answer, models_body

CHAT = "/v1/chat/completions"


@pytest.fixture(autouse=True)
async def _sessions_closed() -> AsyncIterator[None]:
    """The tables' keep-alive sessions on this test's loop close with it."""
    yield
    await close_upstreams()


@pytest.fixture
def servers() -> Iterator[list[ScriptedUpstream]]:
    """Three scripted upstreams (a test may stop one to kill it)."""
    started = [ScriptedUpstream().start() for _ in range(3)]
    yield started
    for server in started:
        if server.loop is not None and server.loop.is_running():
            server.stop()


def table(*bases: str, **changes: Any) -> UpstreamTable:
    """A table over ``bases`` (the comma-separated ``LLM_API_BASE`` form) or ``upstreams=(…)``."""
    if bases:
        changes["llm_api_base"] = ",".join(bases)
    return UpstreamTable(config_module.replace(config_module.get_config(), **changes))


def chat(model: str = "test-model", stream: bool = False) -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream})


async def post(
    upstream: Any, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    response = await upstream.send(
        "POST", CHAT, body=body or chat(), headers=headers or {"content-type": "application/json"}
    )
    try:
        return response.status, await response.read()
    finally:
        await response.aclose()


def hits(server: ScriptedUpstream, path: str = CHAT) -> int:
    return sum(1 for rec in server.requests if rec.path == path)


def key_ordered(members: list[Member], order: list[int]) -> str:
    """A lineage key whose rendezvous order over ``members`` starts with ``order``."""
    for n in itertools.count():
        key = lineage.key("owner", str(n))
        ranked = sorted(range(len(members)), key=lambda i: -rendezvous_score(key, members[i].base, 1.0))
        if ranked[: len(order)] == order:
            return key
    raise AssertionError


def fails(status: int = 500) -> Any:
    return json_answer({"error": {"message": "boom", "type": "InternalServerError", "code": status}}, status)


# -- model routing and the model list -----------------------------------------------------------------


async def test_requests_go_to_an_upstream_that_serves_the_model(servers: list[ScriptedUpstream]) -> None:
    a, b, c = servers
    a.models, b.models, c.models = ["m-a"], ["m-b", "shared"], ["shared"]
    t = table(a.url, b.url, c.url)
    # Ten requests at once on a cold table: each model list is read once (shared), then routed.
    results = await asyncio.gather(*(post(t, chat("m-a")) for _ in range(10)))
    assert [status for status, _ in results] == [200] * 10
    assert [hits(a, "/v1/models"), hits(b, "/v1/models"), hits(c, "/v1/models")] == [1, 1, 1]
    assert (hits(a), hits(b), hits(c)) == (10, 0, 0)
    for _ in range(5):
        await post(t, chat("m-b"))
    assert (hits(a), hits(b), hits(c)) == (10, 5, 0)
    for _ in range(20):
        await post(t, chat("shared"))
    assert hits(a) == 10 and hits(b) > 5 and hits(c) > 0 and hits(b) + hits(c) == 25
    # A model nobody lists goes to one of them, which answers for itself (here: vLLM's default).
    assert (await post(t, chat("unknown")))[0] == 200
    assert hits(a) + hits(b) + hits(c) == 36
    # A multipart form's model field routes too.
    form = b'--X\r\nContent-Disposition: form-data; name="model"\r\n\r\nm-b\r\n--X--\r\n'
    response = await t.send(
        "POST",
        "/v1/audio/transcriptions",
        body=form,
        headers={"content-type": "multipart/form-data; boundary=X"},
    )
    await response.aclose()
    assert b.last().path == "/v1/audio/transcriptions"


async def test_configured_models_route_without_discovery(servers: list[ScriptedUpstream]) -> None:
    a, b, _ = servers
    t = table(
        llm_api_base="",
        upstreams=(
            UpstreamEntry(base_url=a.url, models=("x",)),
            UpstreamEntry(base_url=b.url + "/v1", models=("y",)),
        ),
    )
    await post(t, chat("y"))
    await post(t, chat("x"))
    assert [r.path for r in a.requests] == [CHAT] and [r.path for r in b.requests] == [CHAT]
    assert a.requests[0].json()["model"] == "x" and b.requests[0].json()["model"] == "y"


async def test_model_list_is_the_union_of_the_healthy_upstreams(servers: list[ScriptedUpstream]) -> None:
    a, b, c = servers
    a.models = ["m-a", "shared"]
    shared_b = models_body(["shared", "m-b"])
    shared_b["data"][0]["owned_by"] = "b"
    b.script("/v1/models", json_answer(shared_b))
    c.stop()
    t = table(a.url, b.url, c.url)
    response = await t.send("GET", "/v1/models")
    assert response.status == 200
    body = orjson.loads(await response.read())
    # First card per id, in table order; the dead upstream is skipped (and taken out).
    assert [card["id"] for card in body["data"]] == ["m-a", "shared", "m-b"]
    assert body["data"][1]["owned_by"] == "vllm"
    assert t.states()[c.url]["state"] == "down"
    assert t.states()[a.url] == {"state": "up", "models": ["m-a", "shared"]}


# -- spread and stickiness -----------------------------------------------------------------------------


async def test_requests_without_lineage_are_spread_by_weight(servers: list[ScriptedUpstream]) -> None:
    a, b, _ = servers
    t = table(
        llm_api_base="",
        upstreams=(UpstreamEntry(base_url=a.url, weight=3.0), UpstreamEntry(base_url=b.url, weight=1.0)),
    )
    for _ in range(40):
        await asyncio.gather(*(post(t) for _ in range(10)))
    share = hits(a) / 400
    assert 0.67 < share < 0.83, share


async def test_a_lineage_sticks_to_one_upstream_and_two_tables_agree(servers: list[ScriptedUpstream]) -> None:
    bases = [s.url for s in servers]
    first, second = table(*bases), table(*bases)
    placed: dict[str, int] = {}
    for n in range(30):
        key = lineage.key("tenant", f"conversation-{n}")
        with lineage.bind(key):
            before = [hits(s) for s in servers]
            for _ in range(3):
                await post(first)
            await post(second)
        gained = [hits(s) - was for s, was in zip(servers, before, strict=True)]
        assert sorted(gained) == [0, 0, 4], gained  # every round of it, from both tables, on one
        placed[key] = gained.index(4)
    assert len(set(placed.values())) == 3  # lineages spread over all of them
    # The upstream of some lineages dies: only those move; every other stays where it was.
    servers[0].stop()
    for key, index in placed.items():
        with lineage.bind(key):
            before = [hits(s) for s in servers]
            assert (await post(first))[0] == 200
            gained = [hits(s) - was for s, was in zip(servers, before, strict=True)]
        if index != 0:
            assert gained[index] == 1


async def test_without_affinity_a_lineage_is_spread_by_weight(servers: list[ScriptedUpstream]) -> None:
    t = table(*(s.url for s in servers), routing__affinity=False)
    with lineage.bind(lineage.key("tenant", "one")):
        for _ in range(30):
            await post(t)
    assert sum(1 for s in servers if hits(s)) >= 2


async def test_session_header_carries_the_lineage_when_configured(servers: list[ScriptedUpstream]) -> None:
    a, b, _ = servers
    key = lineage.key("tenant", "resp_1")
    t = table(a.url, b.url, routing__session_header="X-Session-Id")
    single = HttpUpstream(
        config_module.replace(
            config_module.get_config(), llm_api_base=a.url, routing__session_header="x-session-id"
        )
    )
    with lineage.bind(key):
        await post(t)
        await post(single)
    await post(t)
    await post(single)
    with_header = [
        rec for rec in a.requests + b.requests if rec.path == CHAT and "x-session-id" in rec.headers
    ]
    assert len(with_header) == 2 and {rec.headers["x-session-id"] for rec in with_header} == {key}
    assert hits(a) + hits(b) == 4
    # Off by default: never sent.
    plain = table(a.url, b.url)
    with lineage.bind(key):
        await post(plain)
    assert all("x-session-id" not in rec.headers for rec in a.requests[-1:] + b.requests[-1:])


async def test_each_upstream_gets_its_own_key_in_place_of_the_gateways(
    servers: list[ScriptedUpstream],
) -> None:
    a, b, _ = servers
    t = table(
        llm_api_base="",
        openai_api_key=SecretStr("gateway-key"),
        upstreams=(
            UpstreamEntry(base_url=a.url, models=("x",), api_key=SecretStr("key-a")),
            UpstreamEntry(base_url=b.url, models=("y",), api_key=SecretStr("gateway-key")),
        ),
    )
    injected = dict(forward_headers({"content-type": "application/json"}, t.config))
    assert injected["authorization"] == "Bearer gateway-key"
    await post(t, chat("x"), injected)
    await post(t, chat("y"), injected)
    await post(t, chat("x"), {"content-type": "application/json", "authorization": "Bearer callers-own"})
    assert [r.headers["authorization"] for r in a.requests] == ["Bearer key-a", "Bearer callers-own"]
    assert b.last().headers["authorization"] == "Bearer gateway-key"


# -- failover ------------------------------------------------------------------------------------------


async def test_refused_connection_fails_over_and_takes_the_upstream_out(
    servers: list[ScriptedUpstream],
) -> None:
    a, _, _ = servers
    dead = f"http://127.0.0.1:{free_port()}"
    # Configured models: no discovery finds it dead first; the round itself does.
    entries = (
        UpstreamEntry(base_url=dead, models=("test-model",)),
        UpstreamEntry(base_url=a.url, models=("test-model",)),
    )
    t = table(llm_api_base="", upstreams=entries)
    key = key_ordered(t.members, [0])  # its first choice is the dead one
    with lineage.bind(key):
        assert (await post(t))[0] == 200
    assert hits(a) == 1
    assert t.states()[dead]["state"] == "down"
    assert REGISTRY.get_sample_value("gateway_upstream_failovers_total", {"upstream": dead}) == 1
    assert REGISTRY.get_sample_value("gateway_upstream_up", {"upstream": dead}) == 0
    # Out: the next rounds do not try it.
    with lineage.bind(key):
        for _ in range(5):
            assert (await post(t))[0] == 200
    assert hits(a) == 6
    assert REGISTRY.get_sample_value("gateway_upstream_failovers_total", {"upstream": dead}) == 1


async def test_a_5xx_head_fails_over_once_and_no_more(servers: list[ScriptedUpstream]) -> None:
    a, b, c = servers
    t = table(a.url, b.url, c.url, routing__backoff_s=60.0, routing__backoff_max_s=60.0)
    await t.candidates("test-model")
    key = key_ordered(t.members, [0, 1])
    a.script(CHAT, fails(500))
    with lineage.bind(key):
        assert (await post(t))[0] == 200  # a failed, b answered
    assert (hits(a), hits(b), hits(c)) == (1, 1, 0)
    # Both of the first two fail: the second's 500 is the answer; the third is never tried.
    t2 = table(a.url, b.url, c.url)
    await t2.candidates("test-model")
    a.script(CHAT, fails(500))
    b.script(CHAT, fails(503))
    with lineage.bind(key):
        status, body = await post(t2)
    assert status == 503 and b"boom" in body
    assert (hits(a), hits(b), hits(c)) == (2, 2, 0)
    # A 4xx is an answer, not a failure.
    t3 = table(a.url, b.url, c.url)
    await t3.candidates("test-model")
    a.script(CHAT, fails(400))
    with lineage.bind(key):
        assert (await post(t3))[0] == 400
    assert (hits(a), hits(b), hits(c)) == (3, 2, 0)
    assert t3.states()[a.url]["state"] == "up"


async def test_no_head_in_time_fails_over(servers: list[ScriptedUpstream]) -> None:
    a, b, _ = servers
    t = table(a.url, b.url, upstream__read_timeout_s=0.3)
    await t.candidates("test-model")
    key = key_ordered(t.members, [0])
    a.script(CHAT, hang())
    with lineage.bind(key):
        assert (await post(t))[0] == 200
    assert (hits(a), hits(b)) == (1, 1)
    assert t.states()[a.url]["state"] == "down"


async def test_all_failing_raises_the_last_error_after_one_retry(servers: list[ScriptedUpstream]) -> None:
    t = table(*(f"http://127.0.0.1:{free_port()}" for _ in range(3)))
    with pytest.raises(errors.UpstreamError) as info:
        await post(t)
    assert info.value.status == 502
    assert [state["state"] for state in t.states().values()] == ["down", "down", "down"]


async def test_no_retry_once_the_stream_has_begun(servers: list[ScriptedUpstream]) -> None:
    a, b, _ = servers

    async def cut(request: web.Request, rec: Recorded) -> web.StreamResponse:
        response = web.StreamResponse(status=200)
        response.content_type = "text/event-stream"
        await response.prepare(request)
        await response.write(chat_chunks(["Hel"])[0])
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.close()  # the server dies mid-stream
        return response

    t = table(a.url, b.url)
    await t.candidates("test-model")
    key = key_ordered(t.members, [0])
    a.script(CHAT, cut)
    with lineage.bind(key):
        response = await t.send(
            "POST", CHAT, body=chat(stream=True), headers={"content-type": "application/json"}
        )
    chunks = aiter(response)
    assert b"chat.completion.chunk" in await anext(chunks)
    with pytest.raises(errors.UpstreamError, match="mid-response"):
        while True:
            await anext(chunks)
    await response.aclose()
    assert (hits(a), hits(b)) == (1, 0)


async def test_back_off_doubles_and_one_success_brings_it_back(servers: list[ScriptedUpstream]) -> None:
    a, b, _ = servers
    t = table(a.url, b.url, routing__backoff_s=0.2, routing__backoff_max_s=0.3)
    await t.candidates("test-model")
    key = key_ordered(t.members, [0])
    for _ in range(3):
        a.script(CHAT, fails(500))
    with lineage.bind(key):
        await post(t)  # a fails: out for 0.2 s
        state = t.states()[a.url]
        assert state["state"] == "down" and 0.1 < state["retry_in_s"] <= 0.2
        await post(t)  # not tried while out
        assert (hits(a), hits(b)) == (1, 2)
        await asyncio.sleep(0.25)
        assert t.states()[a.url]["state"] == "half_open"
        await post(t)  # tried again, fails again: out for 0.3 s (doubled, capped)
        assert (hits(a), hits(b)) == (2, 3)
        assert 0.2 < t.states()[a.url]["retry_in_s"] <= 0.3
        await asyncio.sleep(0.35)
        await post(t)  # fails a third time: still capped at 0.3 s
        assert 0.2 < t.states()[a.url]["retry_in_s"] <= 0.3
        await asyncio.sleep(0.35)
        assert (await post(t))[0] == 200  # it answers: up again, and the lineage is back on it
        assert t.states()[a.url] == {"state": "up", "models": ["test-model"]}
        await post(t)
    assert (hits(a), hits(b)) == (5, 4)


async def test_requests_failing_together_count_as_one_failure(servers: list[ScriptedUpstream]) -> None:
    """The rounds in flight when an upstream breaks fail at once: one back-off, not ten doublings."""
    a, b, _ = servers
    t = table(a.url, b.url, routing__backoff_s=0.2, routing__backoff_max_s=30.0)
    await t.candidates("test-model")
    key = key_ordered(t.members, [0])
    meeting = Meeting(a, 10)
    for _ in range(10):
        a.script(CHAT, meeting.handler(fails(500)))
    with lineage.bind(key):
        results = await asyncio.gather(*(post(t) for _ in range(10)))
    assert [status for status, _ in results] == [200] * 10
    assert (hits(a), hits(b)) == (10, 10)
    state = t.states()[a.url]
    assert state["failures"] == 1 and state["retry_in_s"] <= 0.2


async def test_with_every_upstream_out_the_first_to_come_back_is_tried(
    servers: list[ScriptedUpstream],
) -> None:
    a, b, _ = servers
    t = table(a.url, b.url, routing__backoff_s=30.0, routing__backoff_max_s=60.0)
    await t.candidates("test-model")
    t.failed(t.members[1], "test")
    await asyncio.sleep(0.01)
    t.failed(t.members[0], "test")
    # Both out; b's back-off ends first: it is tried rather than failing the request.
    assert (await post(t))[0] == 200
    assert (hits(a), hits(b)) == (0, 1)
    assert t.states()[b.url]["state"] == "up"


# -- the gateway: get_upstream, /ready and /metrics ---------------------------------------------------------


def test_one_base_is_the_plain_http_upstream_and_several_a_table(
    gateway_config: Any, servers: list[ScriptedUpstream]
) -> None:
    gateway_config(llm_api_base=servers[0].url)
    assert type(get_upstream()) is HttpUpstream
    gateway_config(llm_api_base=f"{servers[0].url}, {servers[1].url}")
    assert type(get_upstream()) is UpstreamTable


def test_ready_and_metrics_name_each_upstream(
    live_gateway: LiveServer, gateway_config: Any, servers: list[ScriptedUpstream]
) -> None:
    a, b, c = servers
    c.stop()
    # The dead one weighs most, so the first round tries it (and fails over); no discovery first.
    entries = tuple(
        UpstreamEntry(base_url=s.url, models=("test-model",), weight=w)
        for s, w in ((a, 1.0), (b, 1.0), (c, 1e9))
    )
    gateway_config(llm_api_base="", upstreams=entries, routing__backoff_s=30.0, routing__backoff_max_s=60.0)
    # Through the gateway: a chat round works while one upstream is dead.
    for _ in range(6):
        r = httpx.post(
            f"{live_gateway.url}{CHAT}", content=chat(), headers={"content-type": "application/json"}
        )
        assert r.status_code == 200
    r = httpx.get(f"{live_gateway.url}/ready", timeout=10)
    assert r.status_code == 200
    body = r.json()
    assert body["checks"]["upstream"] == {"status": "ok"}
    assert body["upstreams"][a.url] == {"state": "up", "models": ["test-model"]}
    assert body["upstreams"][b.url] == {"state": "up", "models": ["test-model"]}
    dead = body["upstreams"][c.url]
    assert dead["state"] == "down" and 0 < dead["retry_in_s"] <= 30 and dead["failures"] == 1
    text = httpx.get(f"{live_gateway.url}/metrics").text
    assert f'gateway_upstream_up{{upstream="{a.url}"}} 1.0' in text
    assert f'gateway_upstream_up{{upstream="{b.url}"}} 1.0' in text
    assert f'gateway_upstream_up{{upstream="{c.url}"}} 0.0' in text
    assert f'gateway_upstream_failovers_total{{upstream="{c.url}"}} 1.0' in text
    # Every upstream down: not ready, and each is named.
    a.stop()
    b.stop()
    r = httpx.get(f"{live_gateway.url}/ready", timeout=10)
    assert r.status_code == 503
    assert r.json()["checks"]["upstream"] == {"status": "fail", "error": "no upstream is up"}
    assert {state["state"] for state in r.json()["upstreams"].values()} == {"down"}


def test_ready_needs_each_configured_model_served(
    live_gateway: LiveServer, gateway_config: Any, servers: list[ScriptedUpstream]
) -> None:
    a, b, _ = servers
    b.stop()
    gateway_config(
        llm_api_base="",
        upstreams=(
            UpstreamEntry(base_url=a.url, models=("x",)),
            UpstreamEntry(base_url=b.url, models=("y",)),
        ),
    )
    r = httpx.get(f"{live_gateway.url}/ready", timeout=10)
    assert r.status_code == 503
    assert r.json()["checks"]["upstream"]["error"] == "no upstream that is up serves y"
    assert r.json()["upstreams"][a.url]["state"] == "up"
