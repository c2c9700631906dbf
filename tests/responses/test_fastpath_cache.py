"""``POST /v1/responses`` on the ASGI fast path, and the in-process checkpoint cache.

The fast path must answer exactly as the Django view did (auth before the method check, envelopes,
CORS, request id); the cache must never change an answer: deletes (on this process or another),
other owners and a cold process (after a restart) behave as without it.
"""

from __future__ import annotations

import gc
from typing import Any

import httpx
import orjson
import pytest
from django.db import connection

from gateway.core.auth import apikeys
from responses_app.models import Response
from responses_app.storage.history_cache import ENTRY_OVERHEAD, HistoryCache, history_cache
from tests.responses.conftest import Gateway
from tests.responses.scripts import text


@pytest.fixture
def wire() -> str:
    return "responses"


def _turn(gw: Gateway, previous: str | None, words: str, **headers: str) -> httpx.Response:
    gw.script(text(words))
    body: dict[str, Any] = {"model": "m", "input": f"say {words}"}
    if previous is not None:
        body["previous_response_id"] = previous
    return gw.post(body, headers=headers)


def _not_found(response_id: str) -> dict[str, Any]:
    return {
        "error": {
            "message": f"Previous response with id '{response_id}' not found.",
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        }
    }


# --- the cache ---------------------------------------------------------------------------------


def test_a_stored_response_is_cached_and_a_continuation_sees_the_same_history(gw: Gateway) -> None:
    first = _turn(gw, None, "one").json()
    assert first["id"] in history_cache
    second = _turn(gw, first["id"], "two").json()
    warm_input = gw.upstream_bodies()[-1]["input"]
    # A cold process (restart, or another worker): the checkpoint comes from the database.
    history_cache.clear()
    third = _turn(gw, second["id"], "three")
    assert third.status_code == 200
    cold = gw.upstream_bodies()[-1]["input"]
    assert second["id"] in history_cache  # read once, cached from then on
    history_cache.discard(second["id"])
    history_cache.put(second["id"], "default", [])  # proves the next turn reads the cache
    _turn(gw, second["id"], "four")
    assert len(gw.upstream_bodies()[-1]["input"]) == 1
    history_cache.clear()
    _turn(gw, second["id"], "five")
    again = gw.upstream_bodies()[-1]["input"]
    # History: turn 1 input + output, turn 2 input + output, then the new input.
    assert [item.get("role") for item in cold] == ["user", "assistant", "user", "assistant", "user"]
    assert cold[:-1] == again[:-1]
    assert len(warm_input) == 3


def test_delete_on_this_process_invalidates_the_entry(gw: Gateway) -> None:
    first = _turn(gw, None, "one").json()
    assert first["id"] in history_cache
    deleted = httpx.delete(f"{gw.url}/v1/responses/{first['id']}")
    assert deleted.status_code == 200
    assert first["id"] not in history_cache
    refused = _turn(gw, first["id"], "two")
    assert refused.status_code == 400
    assert refused.json() == _not_found(first["id"])


def test_delete_on_another_process_is_not_bypassed(gw: Gateway) -> None:
    first = _turn(gw, None, "one").json()
    assert first["id"] in history_cache
    # Another server process deletes the row: no signal reaches this process's cache.
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {Response._meta.db_table} WHERE id = %s", [first["id"]])
    assert first["id"] in history_cache
    refused = _turn(gw, first["id"], "two")
    assert refused.status_code == 400
    assert refused.json() == _not_found(first["id"])
    assert first["id"] not in history_cache
    assert len(gw.upstream_bodies()) == 1  # refused before any inference


def test_another_owner_cannot_continue_with_a_warm_cache(gw: Gateway) -> None:
    _, alice = apikeys.apikey_create(name="alice")
    _, bob = apikeys.apikey_create(name="bob")
    first = _turn(gw, None, "one", authorization=f"Bearer {alice}").json()
    assert first["id"] in history_cache
    refused = _turn(gw, first["id"], "two", authorization=f"Bearer {bob}")
    assert refused.status_code == 400
    assert refused.json() == _not_found(first["id"])
    assert first["id"] in history_cache  # another owner's miss does not evict the owner's entry
    mine = _turn(gw, first["id"], "two", authorization=f"Bearer {alice}")
    assert mine.status_code == 200


def test_store_false_responses_are_not_cached(gw: Gateway) -> None:
    first = _turn(gw, None, "one").json()
    gw.script(text("two"))
    r = gw.post({"model": "m", "input": "more", "store": False, "previous_response_id": first["id"]})
    assert r.status_code == 200
    assert len(gw.upstream_bodies()[-1]["input"]) == 3
    assert r.json()["id"] not in history_cache
    assert not Response.objects.filter(id=r.json()["id"]).exists()


def test_the_cache_is_bounded_by_bytes_and_copies_out(gateway_config: Any) -> None:
    cache = HistoryCache()
    item = {"type": "message", "id": "msg_1", "content": [{"type": "input_text", "text": "x" * 1000}]}
    size = len(orjson.dumps([item])) + ENTRY_OVERHEAD  # what an entry counts against the bound
    gateway_config(responses__history_cache_bytes=size * 8)
    for n in range(10):
        cache.put(f"resp_{n}", "default", [item])
    assert len(cache) == 8
    assert cache.size_bytes <= size * 8
    assert "resp_0" not in cache and "resp_1" not in cache  # least recently used first
    assert cache.get("resp_9", "someone-else") is None
    got = cache.get("resp_9", "default")
    assert got == [item]
    assert got is not None
    got[0]["id"] = "changed"
    assert cache.get("resp_9", "default") == [item]
    cache.put("resp_big", "default", [item] * 3)  # over a quarter of the budget: not kept
    assert "resp_big" not in cache
    gateway_config(responses__history_cache_bytes=0)
    cache.put("resp_off", "default", [item])
    assert "resp_off" not in cache


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_the_cache_holds_about_the_memory_its_bound_counts(gateway_config: Any) -> None:
    """A full cache must hold about what ``history_cache_bytes`` says, not several times more.

    orjson's output kept as returned held ~4 KiB of the process's memory for a ~400-byte checkpoint
    (6x what the bound counted): the server's RSS grew by ~50 MiB every 10,000 stored responses.
    """
    gateway_config(responses__history_cache_bytes=1 << 30)
    cache = HistoryCache()
    gc.collect()
    before = _rss_bytes()
    for n in range(20_000):
        checkpoint = [
            {
                "id": f"msg_{n:048d}a",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hi"}],
            },
            {
                "id": f"msg_{n:048d}b",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "The quick brown fox jumps.", "annotations": []}],
            },
        ]
        cache.put(f"resp_{n:048d}", "default", checkpoint)
    gc.collect()
    held = _rss_bytes() - before
    assert len(cache) == 20_000
    assert held < 1.5 * cache.size_bytes, (held, cache.size_bytes)


# --- the fast path answers as the Django view did -----------------------------------------------


def test_method_not_allowed_envelope(gw: Gateway) -> None:
    r = httpx.get(f"{gw.url}/v1/responses")
    assert r.status_code == 405
    assert r.headers["allow"] == "POST"
    assert r.headers["x-request-id"]
    assert r.json() == {
        "error": {
            "message": "Method GET is not allowed on /v1/responses.",
            "type": "invalid_request_error",
            "param": None,
            "code": "method_not_allowed",
        }
    }


def test_authentication_comes_before_the_method_check(gw: Gateway) -> None:
    apikeys.apikey_create(name="only")
    r = httpx.get(f"{gw.url}/v1/responses")
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "missing_bearer_token"
    r = gw.post({"model": "m", "input": "hi"}, headers={"authorization": "Bearer nope"})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_token"


def test_content_type_and_json_refusals(gw: Gateway) -> None:
    r = httpx.post(f"{gw.url}/v1/responses", content=b"{}", headers={"content-type": "text/plain"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_content_type"
    assert r.json()["error"]["message"] == (
        "Invalid Content-Type header (text/plain), expected application/json."
    )
    r = httpx.post(
        f"{gw.url}/v1/responses",
        content=b"{nope",
        headers={"content-type": "Application/JSON; charset=utf-8"},
    )
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_json"
    r = gw.post({"model": "m", "input": "hi", "previous_response_id": "resp_missing"})
    assert r.status_code == 400
    assert r.json() == _not_found("resp_missing")


def test_cors_and_request_id_on_the_fast_path(gw: Gateway, settings: Any) -> None:
    settings.CORS_ALLOWED_ORIGINS = ["https://app.example"]
    gw.script(text("hi"))
    r = gw.post(
        {"model": "m", "input": "hi"},
        headers={"origin": "https://app.example", "x-request-id": "req_fastpath_1"},
    )
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    assert r.headers["x-request-id"] == "req_fastpath_1"
    assert r.headers["content-type"] == "application/json"
    refused = httpx.get(f"{gw.url}/v1/responses", headers={"origin": "https://app.example"})
    assert refused.status_code == 405
    assert refused.headers["access-control-allow-origin"] == "https://app.example"


def test_an_unexpected_error_is_a_server_error_envelope(gw: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    async def broken(call: Any) -> Any:
        calls.append(call)
        raise RuntimeError("boom")

    monkeypatch.setattr("responses_app.api.fastpath.create", broken)
    r = gw.post({"model": "m", "input": "hi"})
    assert r.status_code == 500
    assert r.json()["error"] == {
        "message": "The server had an error while processing your request.",
        "type": "server_error",
        "param": None,
        "code": "internal_error",
    }
    assert len(calls) == 1  # the request took the fast path, whose failure this envelope reports


def test_a_client_leaving_a_stream_cancels_the_upstream_request(gw: Gateway) -> None:
    from tests.responses.scripts import Script, handler, path_for

    slow = Script([text(*["word "] * 200)], delay_s=0.05)
    gw.upstream.script(path_for("responses"), handler(slow, "responses"))
    # Unstored (a stored response is finished and stored after its client leaves, as OpenAI does);
    # the built-in tool keeps it on the executor path instead of direct routing.
    body = {"model": "m", "input": "hi", "stream": True, "store": False, "tools": [{"type": "web_search"}]}
    with httpx.stream("POST", f"{gw.url}/v1/responses", json=body, timeout=30) as r:
        assert r.status_code == 200
        seen = b""
        for chunk in r.iter_raw():  # until the upstream is streaming to us
            seen += chunk
            if b"response.output_text.delta" in seen:
                break
        assert seen.startswith(b"event: response.created\n")
    # The gateway saw the disconnect, cancelled the work and closed the upstream request.
    assert gw.upstream.wait_disconnected(gw.upstream.last(path_for("responses")))
    gw.script(text("still serving"))
    assert gw.post({"model": "m", "input": "again"}).status_code == 200
