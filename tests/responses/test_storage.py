"""Retrieval, delete, input_items, input_tokens and usage accounting."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from responses_app.models import Response
from tests.responses.conftest import Gateway
from tests.responses.scripts import call, text
from usage_app.models import UsageRecord


@pytest.fixture
def wire() -> str:
    return "responses"


def test_retrieve_unknown_cross_owner_and_history_only(gw: Gateway) -> None:
    Response.objects.create(
        id="resp_theirs", owner="oidc:other", status="completed", model="m", snapshot={"id": "x"}
    )
    Response.objects.create(id="resp_legacy", owner="default", status="completed", model="m", snapshot=None)
    for rid in ("resp_nope", "resp_theirs"):
        r = httpx.get(f"{gw.url}/v1/responses/{rid}")
        assert r.status_code == 404
        assert r.json()["error"]["message"] == f"Response with id '{rid}' not found."
    r = httpx.get(f"{gw.url}/v1/responses/resp_legacy")
    assert r.status_code == 409
    assert r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):
        gw.client.responses.retrieve("resp_theirs")
    assert httpx.delete(f"{gw.url}/v1/responses/resp_theirs").status_code == 404
    assert Response.objects.filter(id="resp_theirs").exists()
    assert gw.upstream_bodies() == []


def test_retrieve_does_not_call_upstream_and_delete(gw: Gateway) -> None:
    gw.script(text("Kept"))
    created = gw.client.responses.create(model="m", input="x")
    calls = len(gw.upstream.requests)
    got = gw.client.responses.retrieve(created.id)
    assert got.output_text == "Kept"
    assert len(gw.upstream.requests) == calls
    gw.client.responses.delete(created.id)
    assert httpx.get(f"{gw.url}/v1/responses/{created.id}").status_code == 404
    r = httpx.delete(f"{gw.url}/v1/responses/{created.id}")
    assert r.status_code == 404


def test_delete_answer_shape(gw: Gateway) -> None:
    gw.script(text("x"))
    created = gw.post({"model": "m", "input": "x"}).json()
    r = httpx.delete(f"{gw.url}/v1/responses/{created['id']}")
    assert r.status_code == 200
    assert r.json() == {"id": created["id"], "object": "response", "deleted": True}


def test_input_items_pagination(gw: Gateway) -> None:
    gw.script(text("r1"))
    first = gw.post({"model": "m", "input": [{"role": "user", "content": f"u{i}"} for i in range(3)]}).json()
    gw.script(text("r2"))
    second = gw.post({"model": "m", "input": "u3", "previous_response_id": first["id"]}).json()
    url = f"{gw.url}/v1/responses/{second['id']}/input_items"
    everything = httpx.get(url, params={"order": "asc", "limit": 100}).json()
    texts = [i["content"][0]["text"] for i in everything["data"]]
    assert texts == ["u0", "u1", "u2", "r1", "u3"]
    assert everything["has_more"] is False
    assert everything["first_id"] == everything["data"][0]["id"]
    assert everything["last_id"] == everything["data"][-1]["id"]
    desc = httpx.get(url).json()  # default order desc, limit 20
    assert [i["content"][0]["text"] for i in desc["data"]] == list(reversed(texts))
    page1 = httpx.get(url, params={"order": "asc", "limit": 2}).json()
    assert [i["content"][0]["text"] for i in page1["data"]] == ["u0", "u1"]
    assert page1["has_more"] is True
    page2 = httpx.get(url, params={"order": "asc", "limit": 2, "after": page1["last_id"]}).json()
    assert [i["content"][0]["text"] for i in page2["data"]] == ["u2", "r1"]
    assert page2["has_more"] is True
    page3 = httpx.get(url, params={"order": "asc", "limit": 2, "after": page2["last_id"]}).json()
    assert [i["content"][0]["text"] for i in page3["data"]] == ["u3"]
    assert page3["has_more"] is False
    sdk = list(gw.client.responses.input_items.list(second["id"], order="asc", limit=2))
    assert [i.content[0].text for i in sdk] == texts  # the SDK follows has_more/after
    for bad in ({"limit": 0}, {"limit": 101}, {"order": "sideways"}):
        r = httpx.get(url, params=bad)
        assert r.status_code == 400
        assert r.json()["error"]["param"] == next(iter(bad))
    assert httpx.get(f"{gw.url}/v1/responses/resp_unknown/input_items").status_code == 404


def test_stream_retrieval_needs_background(gw: Gateway) -> None:
    gw.script(text("x"))
    created = gw.post({"model": "m", "input": "x"}).json()
    r = httpx.get(f"{gw.url}/v1/responses/{created['id']}", params={"stream": "true"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "stream"


def test_usage_cache_counters(gw: Gateway) -> None:
    gw.script(
        text("x"),
        usage={
            "input_tokens": 100,
            "output_tokens": 5,
            "total_tokens": 111,
            "cached_tokens": 64,
            "cache_write_tokens": 30,
        },
    )
    body = gw.post({"model": "m", "input": "x"}).json()
    assert body["usage"] == {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 64, "cache_write_tokens": 30},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0},
        "total_tokens": 111,  # preserved from the upstream, not recomputed
    }
    gw.script(text("x"), usage={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15})
    body = gw.post({"model": "m", "input": "x"}).json()
    assert "cache_write_tokens" not in body["usage"]["input_tokens_details"]  # unreported stays absent
    assert Response.objects.get(id=body["id"]).usage == body["usage"]


@pytest.mark.parametrize("wire", ["responses", "chat_completions"])
def test_cached_tokens_are_the_engines_summed_over_rounds(gw: Gateway) -> None:
    """Both wires: the engine's cached_tokens (chat's prompt_tokens_details, Responses'
    input_tokens_details) are the response's, summed over its rounds like every counter, and each
    round's ledger row has its own."""
    lookup = {"type": "function", "name": "lookup", "parameters": {"type": "object"}, "async": True}
    gw.script(
        call("lookup", "{}"),
        usage={"input_tokens": 40, "output_tokens": 6, "total_tokens": 46, "cached_tokens": 16},
    )
    gw.script(
        text("Later."),
        usage={"input_tokens": 55, "output_tokens": 2, "total_tokens": 57, "cached_tokens": 48},
    )
    body = gw.post({"model": "m", "input": "go", "tools": [lookup]}).json()
    assert len(gw.upstream_bodies()) == 2
    assert body["usage"]["input_tokens"] == 95
    assert body["usage"]["input_tokens_details"]["cached_tokens"] == 64
    rows = UsageRecord.objects.filter(response_id=body["id"]).order_by("created_at", "id")
    assert [row.cached_tokens for row in rows] == [16, 48]


def test_usage_chat_wire(gw: Gateway, gateway_config: Any) -> None:
    gateway_config(llm_api_base=gw.upstream.url, upstream_api="chat_completions")
    gw.wire = "chat_completions"
    gw.script(text("x"), usage={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15})
    body = gw.post({"model": "m", "input": "x"}).json()
    assert body["usage"] == {
        "input_tokens": 10,
        "input_tokens_details": {},
        "output_tokens": 5,
        "output_tokens_details": {},
        "total_tokens": 15,
    }
    gw.script(
        text("x"),
        usage={
            "input_tokens": 10,
            "output_tokens": 5,
            "total_tokens": 99,
            "cached_tokens": 8,
            "cache_write_tokens": 2,
        },
    )
    body = gw.post({"model": "m", "input": "x"}).json()
    assert body["usage"]["input_tokens_details"] == {"cached_tokens": 8, "cache_write_tokens": 2}
    assert body["usage"]["total_tokens"] == 99


def test_vllm_per_turn_usage_lists_are_accepted_and_not_summed(gw: Gateway) -> None:
    """vLLM 0.32 adds ``input_tokens_per_turn`` (and the like) lists to its usage details."""
    if gw.wire != "responses":
        pytest.skip("a /v1/responses usage field")

    def per_turn(events: list[tuple[str, dict[str, Any]]]) -> None:
        usage = events[-1][1]["response"]["usage"]
        usage["input_tokens_details"].update(input_tokens_per_turn=[12], cached_tokens_per_turn=[0])
        usage["output_tokens_details"].update(output_tokens_per_turn=[7], tool_output_tokens_per_turn=[0])

    gw.script(text("x"), mutate=per_turn)
    body = gw.post({"model": "m", "input": "x"}).json()
    assert body["status"] == "completed", body["error"]
    assert body["usage"]["input_tokens_details"] == {"cached_tokens": 0}
    assert body["usage"]["output_tokens_details"] == {"reasoning_tokens": 0, "tool_output_tokens": 0}


def test_input_tokens_uses_upstream_tokenize(gw: Gateway) -> None:
    async def tokenize(request: web.Request, rec: Any) -> web.StreamResponse:
        return web.json_response({"count": 42, "max_model_len": 4096, "tokens": [1] * 42, "token_strs": None})

    gw.upstream.script("/tokenize", tokenize)
    r = httpx.post(
        f"{gw.url}/v1/responses/input_tokens",
        json={"model": "m", "input": "Count me", "instructions": "Be brief."},
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"object": "response.input_tokens", "input_tokens": 42}
    sent = gw.upstream.last("/tokenize").json()
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Count me"},
    ]
    assert Response.objects.count() == 0

    async def no_tokenizer(request: web.Request, rec: Any) -> web.StreamResponse:
        return web.json_response({"detail": "Not Found"}, status=404)

    gw.upstream.script("/tokenize", no_tokenizer)  # a server without /tokenize
    r = httpx.post(f"{gw.url}/v1/responses/input_tokens", json={"model": "m", "input": "x"})
    assert r.status_code == 501
