"""No stored response is lost under concurrency: a live gateway process (``manage.py serve``, as
``make run`` starts it) on the suite's database kind — a SQLite file, or a fresh PostgreSQL
database — in front of the scripted upstream.

All at once: 64 stored responses (half JSON, half SSE), 16 twenty-turn ``previous_response_id``
chains and 8 Conversations writers (appends to one shared conversation, and Responses turns on
their own conversations). Every request must succeed; afterwards every response is retrievable,
``completed``, with the output the upstream gave it, and every chain's ``input_items`` hold its
whole history in order. Counts, not timings.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web

from tests.responses.scripts import Script, handler, text
from tests.servers import GatewayProcess
from tests.upstream import Recorded

# A gateway process under concurrent load, its requests bounded at 120 s each: more than the default.
pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]

RESPONSES = 64
CHAINS = 16
TURNS = 20
CONVERSATION_WRITERS = 8
CONVERSATION_TURNS = 4


def _last_user_text(body: dict[str, Any]) -> str:
    items = body.get("input")
    if isinstance(items, str):
        return items
    for item in reversed(items or []):
        if item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            return "".join(part.get("text", "") for part in content or [])
    return ""


def echo(text_in: str) -> str:
    return f"echo: {text_in}"


async def _echo_upstream(request: web.Request, rec: Recorded) -> web.StreamResponse:
    """The scripted upstream answers every ``/v1/responses`` call with the request's last user text."""
    if request.path != "/v1/responses":
        return await _default(request, rec)
    return await handler(Script([text(echo(_last_user_text(rec.json())))]), "responses")(request, rec)


_default: Any = None


@pytest.fixture
def gateway_process(upstream: Any) -> Iterator[str]:
    global _default
    _default = upstream.default
    upstream.default = _echo_upstream
    env = {"LLM_API_BASE": upstream.url, "LOG_LEVEL": "WARNING", "UPSTREAM_API": "responses"}
    gateway = GatewayProcess(env, log=os.devnull)  # on a database of its own in the PostgreSQL leg
    try:
        gateway.wait(60)
        yield gateway.url
    finally:
        gateway.stop()


async def _json_response(client: httpx.AsyncClient, prompt: str, **extra: Any) -> dict[str, Any]:
    r = await client.post("/v1/responses", json={"model": "m", "input": prompt, "store": True, **extra})
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    assert answer["status"] == "completed", answer
    return answer


async def _sse_response(client: httpx.AsyncClient, prompt: str) -> dict[str, Any]:
    body = {"model": "m", "input": prompt, "store": True, "stream": True}
    async with client.stream("POST", "/v1/responses", json=body) as r:
        assert r.status_code == 200, await r.aread()
        raw = await r.aread()
    events = [orjson.loads(block.split(b"\ndata: ", 1)[1]) for block in raw.split(b"\n\n") if block.strip()]
    assert events[-1]["type"] == "response.completed", events[-1]
    response: dict[str, Any] = events[-1]["response"]
    return response


def _output_text(response: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )


async def _chain(client: httpx.AsyncClient, index: int) -> list[str]:
    ids: list[str] = []
    previous: str | None = None
    for turn in range(TURNS):
        extra = {"previous_response_id": previous} if previous else {}
        answer = await _json_response(client, f"chain {index} turn {turn}", **extra)
        assert _output_text(answer) == echo(f"chain {index} turn {turn}")
        previous = answer["id"]
        ids.append(previous)
    return ids


async def _conversation_writer(
    client: httpx.AsyncClient, index: int, shared: str
) -> tuple[str, list[str], list[str]]:
    """Appends to the shared conversation and Responses turns on its own; returns what it wrote."""
    r = await client.post("/v1/conversations", json={})
    assert r.status_code == 200, r.text
    own = r.json()["id"]
    appended: list[str] = []
    turns: list[str] = []
    for turn in range(CONVERSATION_TURNS):
        message = f"writer {index} append {turn}"
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": message}]}
        r = await client.post(f"/v1/conversations/{shared}/items", json={"items": [item]})
        assert r.status_code == 200, r.text
        appended.append(message)
        prompt = f"writer {index} turn {turn}"
        answer = await _json_response(client, prompt, conversation=own)
        assert _output_text(answer) == echo(prompt)
        turns.append(answer["id"])
    return own, appended, turns


def _item_texts(items: list[dict[str, Any]]) -> list[str]:
    return ["".join(part.get("text", "") for part in item.get("content") or []) for item in items]


async def _run(base: str) -> None:
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        r = await client.post("/v1/conversations", json={})
        assert r.status_code == 200, r.text
        shared = r.json()["id"]
        singles = [
            (_sse_response if i % 2 else _json_response)(client, f"single {i}") for i in range(RESPONSES)
        ]
        chains = [_chain(client, i) for i in range(CHAINS)]
        writers = [_conversation_writer(client, i, shared) for i in range(CONVERSATION_WRITERS)]
        results = await asyncio.gather(*singles, *chains, *writers, return_exceptions=True)
        failures = [repr(r) for r in results if isinstance(r, BaseException)]
        assert failures == [], f"{len(failures)} of {len(results)} failed: {failures[:5]}"

        # Every single response is stored completed, with the output it was sent.
        for i, response in enumerate(results[:RESPONSES]):
            assert isinstance(response, dict)
            r = await client.get(f"/v1/responses/{response['id']}")
            assert r.status_code == 200, r.text
            stored = r.json()
            assert stored["status"] == "completed"
            assert _output_text(stored) == echo(f"single {i}")

        # Every chain turn is stored completed, and the last one's input holds the whole chain.
        for index, ids in enumerate(results[RESPONSES : RESPONSES + CHAINS]):
            assert isinstance(ids, list) and len(ids) == TURNS
            for turn, response_id in enumerate(ids):
                stored = (await client.get(f"/v1/responses/{response_id}")).json()
                assert stored["status"] == "completed"
                assert _output_text(stored) == echo(f"chain {index} turn {turn}")
            r = await client.get(
                f"/v1/responses/{ids[-1]}/input_items", params={"order": "asc", "limit": 100}
            )
            assert r.status_code == 200, r.text
            expected: list[str] = []
            for turn in range(TURNS):
                expected.append(f"chain {index} turn {turn}")
                if turn < TURNS - 1:
                    expected.append(echo(f"chain {index} turn {turn}"))
            assert _item_texts(r.json()["data"]) == expected
            assert r.json()["has_more"] is False

        # The shared conversation holds every append, each writer's in its own order; every
        # writer's own conversation holds its turns in order.
        r = await client.get(f"/v1/conversations/{shared}/items", params={"order": "asc", "limit": 100})
        assert r.status_code == 200, r.text
        shared_texts = _item_texts(r.json()["data"])
        assert len(shared_texts) == CONVERSATION_WRITERS * CONVERSATION_TURNS
        for own, appended, turns in results[RESPONSES + CHAINS :]:  # type: ignore[misc]
            assert [t for t in shared_texts if t.startswith(appended[0].rsplit(" ", 2)[0] + " ")] == appended
            for response_id in turns:
                assert (await client.get(f"/v1/responses/{response_id}")).json()["status"] == "completed"
            r = await client.get(f"/v1/conversations/{own}/items", params={"order": "asc", "limit": 100})
            texts = _item_texts(r.json()["data"])
            writer = appended[0].split(" ")[1]
            expected = []
            for turn in range(CONVERSATION_TURNS):
                expected += [f"writer {writer} turn {turn}", echo(f"writer {writer} turn {turn}")]
            assert texts == expected


def test_concurrent_stored_responses_chains_and_conversations_lose_nothing(gateway_process: str) -> None:
    asyncio.run(_run(gateway_process))
