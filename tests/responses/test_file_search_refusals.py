"""Every refusal of a ``file_search`` declaration: the status, the error envelope with its
``param``, before any work (the model is never called) and with nothing stored, on HTTP (the
openai SDK) and on the WebSocket transport."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import openai
import pytest
from django.utils import timezone
from openai import OpenAI

from conversations_app.models import Item
from files_app.models import VectorStore
from responses_app.models import Response
from tests.responses.file_search_fixtures import make_store
from tests.responses.wsutil import Client, connect, create


@pytest.fixture
def sdk(live_gateway: Any, upstream: Any, gateway_config: Callable[..., Any]) -> Iterator[OpenAI]:
    gateway_config(llm_api_base=upstream.url, upstream_api="responses")
    client = OpenAI(base_url=f"{live_gateway.url}/v1", api_key="sk-test", max_retries=0, timeout=30)
    yield client
    client.close()


MISSING = object()


def refused(sdk: OpenAI, upstream: Any, tools: list[Any], **fields: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(openai.APIStatusError) as caught:
        sdk.responses.create(model="m", input="hi", tools=tools, **fields)
    assert not upstream.requests  # before any work
    assert Response.objects.count() == 0 and Item.objects.count() == 0  # nothing stored
    body = caught.value.body
    assert isinstance(body, dict) and set(body) == {"message", "type", "param", "code"}
    return caught.value.status_code, body


def test_another_owners_store_and_a_missing_store_are_not_found(sdk: OpenAI, upstream: Any) -> None:
    mine, _ = make_store([("a.txt", "alpha", {})])
    theirs, _ = make_store([("b.txt", "beta", {})], owner="oidc:other")
    for ids in ([theirs.id], [mine.id, "vs_missing"]):
        status, error = refused(sdk, upstream, [{"type": "file_search", "vector_store_ids": ids}])
        assert status == 404
        assert error["param"] == f"tools[0].vector_store_ids[{len(ids) - 1}]"
        assert error["message"] == f"No vector store found with id '{ids[-1]}'."  # as OpenAI words it
        assert (error["type"], error["code"]) == ("invalid_request_error", None)
    # The index of the tool is the one declared.
    status, error = refused(
        sdk,
        upstream,
        [{"type": "function", "name": "f"}, {"type": "file_search", "vector_store_ids": [theirs.id]}],
    )
    assert (status, error["param"]) == (404, "tools[1].vector_store_ids[0]")


def test_a_malformed_declaration_is_refused_before_the_history_is_read(sdk: OpenAI, upstream: Any) -> None:
    store, _ = make_store([("a.txt", "alpha", {})])
    declared = {"type": "file_search", "vector_store_ids": [store.id], "ranking_options": {"ranker": "x"}}
    status, error = refused(sdk, upstream, [declared], previous_response_id="resp_missing")
    assert (status, error["param"]) == (400, "tools[0].ranking_options.ranker")


def test_an_expired_store_is_refused(sdk: OpenAI, upstream: Any) -> None:
    store, _ = make_store([("a.txt", "alpha", {})])
    VectorStore.objects.filter(id=store.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    status, error = refused(sdk, upstream, [{"type": "file_search", "vector_store_ids": [store.id]}])
    assert (status, error["param"], error["code"]) == (400, "tools[0].vector_store_ids[0]", "expired")


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"vector_store_ids": MISSING}, "tools[0].vector_store_ids", "missing_required_parameter"),
        ({"vector_store_ids": []}, "tools[0].vector_store_ids", "empty_array"),
        ({"vector_store_ids": "vs_1"}, "tools[0].vector_store_ids", "invalid_type"),
        ({"vector_store_ids": [7]}, "tools[0].vector_store_ids[0]", "invalid_type"),
        ({"max_num_results": 0}, "tools[0].max_num_results", "integer_below_min_value"),
        ({"max_num_results": 51}, "tools[0].max_num_results", "integer_above_max_value"),
        ({"max_num_results": "5"}, "tools[0].max_num_results", "invalid_type"),
        ({"filters": {"type": "near", "key": "a", "value": 1}}, "tools[0].filters.type", "invalid_value"),
        ({"filters": "team=ops"}, "tools[0].filters", "invalid_type"),
        ({"ranking_options": {"ranker": "best"}}, "tools[0].ranking_options.ranker", "invalid_value"),
        (
            {"ranking_options": {"score_threshold": 2}},
            "tools[0].ranking_options.score_threshold",
            "invalid_value",
        ),
        ({"ranking_options": {"boost": 1}}, "tools[0].ranking_options.boost", "unknown_parameter"),
        (
            {"ranking_options": {"hybrid_search": {"embedding_weight": 1}}},
            "tools[0].ranking_options.hybrid_search.text_weight",
            "missing_required_parameter",
        ),
        ({"rewrite_query": True}, "tools[0].rewrite_query", "unknown_parameter"),
        (
            {"filters": {"type": "and", "filters": [{"type": "eq", "key": "a"}]}},
            "tools[0].filters.filters[0].value",
            "missing_required_parameter",
        ),
        (
            # A keyword-only store cannot serve semantic ranking.
            {"ranking_options": {"hybrid_search": {"embedding_weight": 1, "text_weight": 0}}},
            "tools[0].ranking_options.hybrid_search",
            "embedding_model_mismatch",
        ),
    ],
)
def test_malformed_declarations_are_400(
    sdk: OpenAI, upstream: Any, fields: dict[str, Any], param: str, code: str
) -> None:
    store, _ = make_store([("a.txt", "alpha", {})])
    declared = {"type": "file_search", "vector_store_ids": [store.id], **fields}
    declared = {k: v for k, v in declared.items() if v is not MISSING}
    status, error = refused(sdk, upstream, [declared])
    assert (status, error["param"], error["code"]) == (400, param, code)


def test_refused_on_the_websocket_too(
    live_gateway: Any, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    gateway_config(llm_api_base=upstream.url, upstream_api="responses")
    theirs, _ = make_store([("b.txt", "beta", {})], owner="oidc:other")

    async def scenario() -> dict[str, Any]:
        async with await connect(live_gateway.url) as ws:
            client = Client(ws)
            await client.send(create(tools=[{"type": "file_search", "vector_store_ids": [theirs.id]}]))
            return await client.recv()

    event = asyncio.run(scenario())
    assert event["type"] == "error" and event["status"] == 404
    assert event["error"]["param"] == "tools[0].vector_store_ids[0]"
    assert not upstream.requests and Response.objects.count() == 0
