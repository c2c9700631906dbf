"""``POST /v1/vector_stores/{id}/search`` with the official SDK against the live gateway."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest

from files_app import retrieval
from files_app.models import VectorStoreFile
from tests.conversations.conftest import OWNER_HEADER, owned_gateway, sdk  # noqa: F401  (a fixture)
from tests.files.retrieval_rows import EMBEDDING_MODEL, add_file, make_store
from tests.servers import LiveServer
from tests.upstream import word_vector

CATS = "Cats purr and sleep most of the day; a cat eats fish and chases mice."
DOGS = "Dogs bark at strangers, fetch sticks and love long walks in the park."
BIRDS = "Birds build nests, sing at dawn and migrate south for the winter."


@pytest.fixture
def client(live_gateway: LiveServer) -> openai.OpenAI:
    retrieval.cache.clear()
    return sdk(live_gateway.url)


def test_search_answers_openais_page(client: openai.OpenAI) -> None:
    store = make_store()
    cats = add_file(store, "cats.txt", [CATS], attributes={"kind": "pets", "year": 2024})
    add_file(store, "dogs.txt", [DOGS], attributes={"kind": "pets", "year": 2020})
    add_file(store, "draft.txt", ["a cat draft"], status=VectorStoreFile.Status.IN_PROGRESS)

    raw = client.vector_stores.with_raw_response.search(store.id, query="cat fish")
    body = raw.http_response.json()
    assert raw.http_response.status_code == 200
    assert body == {
        "object": "vector_store.search_results.page",
        "search_query": ["cat fish"],
        "data": [
            {
                "file_id": cats.file_id,
                "filename": "cats.txt",
                "score": body["data"][0]["score"],
                "attributes": {"kind": "pets", "year": 2024},
                "content": [{"type": "text", "text": CATS}],
            }
        ],
        "has_more": False,
        "next_page": None,
    }
    assert 0 < body["data"][0]["score"] <= 1

    page = client.vector_stores.search(
        store.id,
        query=["cat", "dogs bark"],
        max_num_results=1,
        rewrite_query=False,
        ranking_options={"ranker": "auto", "score_threshold": 0.1},
    )
    assert len(page.data) == 1
    both = client.vector_stores.search(store.id, query=["cat", "dogs bark"], max_num_results=50)
    assert sorted(r.filename for r in both.data) == ["cats.txt", "dogs.txt"]
    old = client.vector_stores.search(
        store.id, query=["cat", "dogs"], filters={"type": "lt", "key": "year", "value": 2022}
    )
    assert [r.filename for r in old.data] == ["dogs.txt"]
    assert client.vector_stores.search(store.id, query="zebra").data == []


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"max_num_results": 0}, "max_num_results", "integer_below_min_value"),
        ({"max_num_results": 51}, "max_num_results", "integer_above_max_value"),
        ({"max_num_results": "5"}, "max_num_results", "invalid_type"),
        ({"rewrite_query": True}, "rewrite_query", "unsupported_parameter"),
        ({"query": []}, "query", "empty_array"),
        ({"query": ["ok", 3]}, "query[1]", "invalid_type"),
        ({"query": {"q": 1}}, "query", "invalid_type"),
        ({"query": "  "}, "query", "invalid_value"),
        ({"colour": "red"}, "colour", "unknown_parameter"),
        (
            {
                "filters": {
                    "type": "and",
                    "filters": [{"type": "eq", "key": "a", "value": 1}, {"type": "not"}],
                }
            },
            "filters.filters[1].type",
            "invalid_value",
        ),
        ({"ranking_options": {"ranker": "fastest"}}, "ranking_options.ranker", "invalid_value"),
        ({"ranking_options": {"score_threshold": 2}}, "ranking_options.score_threshold", "invalid_value"),
    ],
)
def test_wrong_requests_are_400_with_param(
    client: openai.OpenAI, extra: dict[str, Any], param: str, code: str
) -> None:
    store = make_store()
    body = {"query": "cat", **extra}
    with pytest.raises(openai.BadRequestError) as exc:
        client.post(f"/vector_stores/{store.id}/search", body=body, cast_to=object)
    assert exc.value.status_code == 400
    assert exc.value.body["param"] == param  # type: ignore[index]
    assert exc.value.body["code"] == code  # type: ignore[index]
    assert exc.value.body["type"] == "invalid_request_error"  # type: ignore[index]


def test_missing_query_and_unknown_store(client: openai.OpenAI) -> None:
    store = make_store()
    with pytest.raises(openai.BadRequestError) as exc:
        client.post(f"/vector_stores/{store.id}/search", body={}, cast_to=object)
    assert exc.value.body["param"] == "query"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as missing:
        client.vector_stores.search("vs_nope", query="cat")
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.search("vs_\x00", query="cat")
    assert missing.value.body == {
        "message": "No vector store found with id 'vs_nope'.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }


def test_another_owners_store_is_404(owned_gateway: LiveServer) -> None:  # noqa: F811
    alice = sdk(owned_gateway.url, **{OWNER_HEADER: "key:alice"})
    bob = sdk(owned_gateway.url, **{OWNER_HEADER: "key:bob"})
    store = make_store(owner="key:alice")
    add_file(store, "secret.txt", ["the cat's secret"])
    assert [r.filename for r in alice.vector_stores.search(store.id, query="cat").data] == ["secret.txt"]
    for other in (bob, sdk(owned_gateway.url)):
        with pytest.raises(openai.NotFoundError) as exc:
            other.vector_stores.search(store.id, query="cat")
        assert exc.value.body["message"] == f"No vector store found with id '{store.id}'."  # type: ignore[index]


def test_hybrid_search_embeds_the_query_upstream(
    client: openai.OpenAI, upstream: Any, gateway_config: Callable[..., Any]
) -> None:
    """With an embedding model configured, a store built with it is searched hybrid by default (the
    query embedded by the upstream's /v1/embeddings), or semantic alone when the weights say so."""
    gateway_config(llm_api_base=upstream.url, file_search__embedding_model=EMBEDDING_MODEL)
    upstream.word_vectors = 64
    store = make_store(model=EMBEDDING_MODEL, dimensions=64)
    for name, text in (("cats.txt", CATS), ("dogs.txt", DOGS), ("birds.txt", BIRDS)):
        add_file(store, name, [(text, word_vector(text, 64))])

    page = client.vector_stores.search(store.id, query="where do birds build nests")
    assert page.data[0].filename == "birds.txt"
    assert page.data[0].score == 1.0  # first in both rankings
    embedded = [r.json() for r in upstream.requests if r.path == "/v1/embeddings"]
    assert [(e["model"], e["input"]) for e in embedded] == [(EMBEDDING_MODEL, ["where do birds build nests"])]

    semantic = {"hybrid_search": {"embedding_weight": 1, "text_weight": 0}}
    page = client.vector_stores.search(store.id, query="birds sing at dawn", ranking_options=semantic)  # type: ignore[typeddict-unknown-key]
    assert page.data[0].filename == "birds.txt"

    # A store built in another embedding space: keyword by default, a 400 when semantic is asked.
    other = make_store(model="another-model", dimensions=64)
    add_file(other, "birds.txt", [(BIRDS, word_vector(BIRDS, 64))])
    assert [r.filename for r in client.vector_stores.search(other.id, query="nests").data] == ["birds.txt"]
    with pytest.raises(openai.BadRequestError) as exc:
        client.vector_stores.search(other.id, query="nests", ranking_options=semantic)  # type: ignore[typeddict-unknown-key]
    assert exc.value.body["param"] == "ranking_options.hybrid_search"  # type: ignore[index]
    assert exc.value.body["code"] == "embedding_model_mismatch"  # type: ignore[index]
    assert len([r for r in upstream.requests if r.path == "/v1/embeddings"]) == 2
