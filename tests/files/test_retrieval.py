"""Retrieval over published chunks (files_app.retrieval): keyword, semantic and hybrid ranking,
filters, thresholds, ownership, unpublished chunks and the per-revision index cache."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import pytest
from django.utils import timezone

from files_app import retrieval
from files_app.filters import parse_filters
from files_app.models import VectorStore, VectorStoreFile
from files_app.retrieval import Hit, execute, prepare
from gateway.core import errors
from gateway.core.db import run_orm
from tests.files.retrieval_rows import EMBEDDING_MODEL, add_file, embedder, make_store
from tests.upstream import word_vector

pytestmark = pytest.mark.django_db

CATS = "Cats purr and sleep most of the day; a cat eats fish and chases mice."
DOGS = "Dogs bark at strangers, fetch sticks and love long walks in the park."
BIRDS = "Birds build nests, sing at dawn and migrate south for the winter."
MIXED = "The shelter houses dogs and one cat; volunteers walk the dogs daily."


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    retrieval.cache.clear()


def run(owner: str = "default", **kwargs: Any) -> list[Hit]:
    vectors = kwargs.pop("vectors", None)
    kwargs.setdefault("queries", ["cat"])
    return execute(prepare(owner=owner, **kwargs), vectors)


def names(hits: list[Hit]) -> list[str]:
    return [h.filename for h in hits]


def test_keyword_ranks_the_matching_file_first() -> None:
    store = make_store()
    cats = add_file(store, "cats.txt", [CATS], attributes={"kind": "pets"})
    add_file(store, "dogs.txt", [DOGS])
    add_file(store, "birds.txt", [BIRDS])
    add_file(store, "mixed.txt", [MIXED])

    hits = run(vector_store_ids=[store.id], queries=["cat eats fish"])
    assert names(hits) == ["cats.txt", "mixed.txt"]  # only chunks holding a query term
    best = hits[0]
    assert best.to_dict() == {
        "file_id": cats.file_id,
        "filename": "cats.txt",
        "score": best.score,
        "attributes": {"kind": "pets"},
        "content": [{"type": "text", "text": CATS}],
    }
    assert 1 >= hits[0].score > hits[1].score > 0
    assert names(run(vector_store_ids=[store.id], queries=["dogs walk"])) == ["mixed.txt", "dogs.txt"]
    assert run(vector_store_ids=[store.id], queries=["zebra quantum"]) == []
    # Several queries: each chunk scores its best over them.
    both = run(vector_store_ids=[store.id], queries=["fish", "nests dawn"])
    assert set(names(both)) == {"cats.txt", "birds.txt"}


def test_keyword_scores_are_relative_to_the_best_each_term_reaches() -> None:
    store = make_store()
    add_file(store, "both.txt", ["cat dog"])
    add_file(store, "cat.txt", ["cat"])
    assert [(h.filename, h.score) for h in run(vector_store_ids=[store.id], queries=["dog"])] == [
        ("both.txt", 1.0)
    ]
    cat = run(vector_store_ids=[store.id], queries=["cat"])
    assert names(cat) == ["cat.txt", "both.txt"]
    assert cat[0].score == 1.0 and 0 < cat[1].score < 1


def test_a_query_of_stop_words_matches_nothing() -> None:
    store = make_store()
    add_file(store, "empty.txt", ["", "!!"])
    add_file(store, "stop.txt", ["the of and"])
    add_file(store, "cat.txt", ["the cat"])
    assert run(vector_store_ids=[store.id], queries=["the of", "?"]) == []
    assert names(run(vector_store_ids=[store.id], queries=["the cat"])) == ["cat.txt"]


def test_unpublished_chunks_are_never_returned() -> None:
    store = make_store()
    add_file(store, "done.txt", ["a cat sat on the mat with a dog"])
    for status in (
        VectorStoreFile.Status.IN_PROGRESS,
        VectorStoreFile.Status.FAILED,
        VectorStoreFile.Status.CANCELLED,
    ):
        add_file(store, f"{status}.txt", ["cat cat cat cat"], status=status)
    assert names(run(vector_store_ids=[store.id], queries=["cat"], max_num_results=50)) == ["done.txt"]
    # Not indexed either: the better unpublished chunks take no place among the results.
    assert names(run(vector_store_ids=[store.id], queries=["cat"], max_num_results=1)) == ["done.txt"]


def test_a_chunk_unpublished_since_the_index_was_built_is_left_out() -> None:
    store = make_store()
    add_file(store, "stays.txt", ["cat"])
    leaves = add_file(store, "leaves.txt", ["cat"])
    assert sorted(names(run(vector_store_ids=[store.id]))) == ["leaves.txt", "stays.txt"]
    leaves.status = VectorStoreFile.Status.FAILED  # without a new revision: the cached index still has it
    leaves.save(update_fields=["status"])
    assert names(run(vector_store_ids=[store.id])) == ["stays.txt"]


def test_filters_select_files_by_attributes() -> None:
    store = make_store()
    add_file(store, "a.txt", ["cat one"], attributes={"year": 2020, "lang": "en"})
    add_file(store, "b.txt", ["cat two"], attributes={"year": 2024, "lang": "en"})
    add_file(store, "c.txt", ["cat three"], attributes={"year": 2024, "lang": "fr"})
    recent_en = parse_filters(
        {
            "type": "and",
            "filters": [
                {"type": "gte", "key": "year", "value": 2022},
                {"type": "eq", "key": "lang", "value": "en"},
            ],
        }
    )
    assert names(run(vector_store_ids=[store.id], filters=recent_en)) == ["b.txt"]
    fr_or_old = parse_filters(
        {
            "type": "or",
            "filters": [
                {"type": "lt", "key": "year", "value": 2021},
                {"type": "in", "key": "lang", "value": ["fr"]},
            ],
        }
    )
    assert sorted(names(run(vector_store_ids=[store.id], filters=fr_or_old))) == ["a.txt", "c.txt"]


def test_score_threshold_and_max_num_results() -> None:
    store = make_store()
    for i in range(8):
        add_file(store, f"f{i}.txt", ["cat " + "filler words here " * i])
    hits = run(vector_store_ids=[store.id])
    assert len(hits) == 8 and [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert names(hits)[0] == "f0.txt"  # shortest chunk: BM25's length normalisation
    assert len(run(vector_store_ids=[store.id], max_num_results=3)) == 3
    middle = hits[3].score
    kept = run(vector_store_ids=[store.id], ranking_options={"score_threshold": middle})
    assert kept == hits[:4]
    assert all(h.score >= middle for h in kept)


def test_another_owners_store_is_404() -> None:
    store = make_store(owner="key:alice")
    add_file(store, "secret.txt", ["cat secrets"])
    with pytest.raises(errors.NotFound) as exc:
        run(owner="key:bob", vector_store_ids=[store.id])
    assert (exc.value.message, exc.value.param) == (f"No vector store found with id '{store.id}'.", None)
    with pytest.raises(errors.NotFound) as exc:
        prepare(
            owner="key:bob",
            vector_store_ids=[store.id],
            queries=["cat"],
            store_params=["tools[0].vector_store_ids[0]"],
        )
    assert exc.value.param == "tools[0].vector_store_ids[0]"
    assert names(run(owner="key:alice", vector_store_ids=[store.id])) == ["secret.txt"]


def test_a_search_is_activity_and_an_expired_store_is_refused() -> None:
    store = make_store()
    add_file(store, "a.txt", ["cat"])
    long_ago = timezone.now() - datetime.timedelta(days=2)
    VectorStore.objects.filter(id=store.id).update(
        last_active_at=long_ago, expires_after={"anchor": "last_active_at", "days": 7}
    )
    run(vector_store_ids=[store.id])
    store.refresh_from_db()
    assert timezone.now() - store.last_active_at < datetime.timedelta(seconds=30)
    assert store.expires_at == store.last_active_at + datetime.timedelta(days=7)

    VectorStore.objects.filter(id=store.id).update(expires_at=long_ago)
    with pytest.raises(errors.BadRequest) as exc:
        prepare(
            owner="default",
            vector_store_ids=[store.id],
            queries=["cat"],
            store_params=["vector_store_ids[0]"],
        )
    assert (exc.value.message, exc.value.param, exc.value.code) == (
        f"Vector store with id '{store.id}' has expired.",
        "vector_store_ids[0]",
        "expired",
    )


def test_the_index_is_cached_per_revision() -> None:
    store = make_store()
    add_file(store, "one.txt", ["cat one"])
    assert names(run(vector_store_ids=[store.id])) == ["one.txt"]
    builds = retrieval.cache.builds
    run(vector_store_ids=[store.id])
    assert retrieval.cache.builds == builds  # same revision: the cached index

    # Chunks published without a new revision are not seen (the index is keyed by revision) ...
    add_file(store, "two.txt", ["cat two"], bump=False)
    store.refresh_from_db()
    assert names(run(vector_store_ids=[store.id])) == ["one.txt"]
    # ... and a new revision rebuilds it, on every replica alike.
    store.revision += 1
    store.save(update_fields=["revision"])
    assert sorted(names(run(vector_store_ids=[store.id]))) == ["one.txt", "two.txt"]
    assert retrieval.cache.builds == builds + 1


def test_the_cache_is_bounded(gateway_config: Callable[..., Any]) -> None:
    gateway_config(file_search__index_cache_bytes=1)
    stores = [make_store() for _ in range(3)]
    for store in stores:
        add_file(store, "x.txt", ["cat"])
        run(vector_store_ids=[store.id])
    assert len(retrieval.cache) == 1  # only the newest stays


def test_a_store_over_the_chunk_limit_is_refused(gateway_config: Callable[..., Any]) -> None:
    gateway_config(file_search__max_chunks_per_store=3)
    store = make_store()
    add_file(store, "big.txt", ["cat"] * 4)
    with pytest.raises(errors.BadRequest) as exc:
        run(vector_store_ids=[store.id])
    assert exc.value.code == "vector_store_too_large"


# ----------------------------------------------------------------------------- semantic and hybrid
X, Y, Z = [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]


def embedded_store() -> Any:
    store = make_store(model=EMBEDDING_MODEL, dimensions=4)
    add_file(store, "felines.txt", [("Felines purr.", X)])
    add_file(store, "cats.txt", [("cat cat cat", Z)])
    add_file(store, "canines.txt", [("Canines bark.", Y)])
    return store


def test_semantic_ranks_by_embedding(gateway_config: Callable[..., Any]) -> None:
    gateway_config(file_search__embedding_model=EMBEDDING_MODEL)
    store = embedded_store()
    search = prepare(owner="default", vector_store_ids=[store.id], queries=["kitty"], mode="semantic")
    assert search.needs_embeddings
    hits = execute(search, [[0.9, 0.1, 0.0, 0.0]])
    assert names(hits) == ["felines.txt", "canines.txt"]  # no shared word: cosine alone
    assert hits[0].score == pytest.approx(0.9 / (0.82**0.5), abs=1e-5)


def test_hybrid_is_the_default_and_fuses_ranks(gateway_config: Callable[..., Any]) -> None:
    gateway_config(file_search__embedding_model=EMBEDDING_MODEL)
    store = embedded_store()
    search = prepare(owner="default", vector_store_ids=[store.id], queries=["cat"])
    assert [p.mode for p in search.stores] == ["hybrid"]
    # Keyword: cats.txt only; semantic: felines.txt (0.9), cats.txt (0.3).
    hits = execute(search, [[0.9, 0.0, 0.3, 0.0]])
    assert names(hits) == ["cats.txt", "felines.txt"]
    # Reciprocal rank fusion with k = 60: (1/61 + 1/62) / (2/61) and (1/61) / (2/61).
    assert hits[0].score == pytest.approx(0.991935, abs=1e-5)
    assert hits[1].score == pytest.approx(0.5, abs=1e-5)
    # Weights: the text side alone is keyword search.
    weights = {"hybrid_search": {"embedding_weight": 0, "text_weight": 1}}
    keyword = prepare(owner="default", vector_store_ids=[store.id], queries=["cat"], ranking_options=weights)
    assert not keyword.needs_embeddings and names(execute(keyword)) == ["cats.txt"]


def test_another_embedding_space_is_keyword_or_a_400(gateway_config: Callable[..., Any]) -> None:
    gateway_config(file_search__embedding_model="another-model")
    store = embedded_store()
    search = prepare(owner="default", vector_store_ids=[store.id], queries=["cat"])
    assert [p.mode for p in search.stores] == ["keyword"] and not search.needs_embeddings
    assert names(execute(search)) == ["cats.txt"]
    with pytest.raises(errors.BadRequest) as exc:
        prepare(
            owner="default",
            vector_store_ids=[store.id],
            queries=["cat"],
            ranking_options={"hybrid_search": {"embedding_weight": 1, "text_weight": 0}},
        )
    assert (exc.value.param, exc.value.code) == ("ranking_options.hybrid_search", "embedding_model_mismatch")
    assert "'another-model'" in exc.value.message


@pytest.mark.parametrize(
    ("raw", "param", "code"),
    [
        ([], "ranking_options", "invalid_type"),
        ({"ranker": "best"}, "ranking_options.ranker", "invalid_value"),
        ({"score_threshold": 1.5}, "ranking_options.score_threshold", "invalid_value"),
        ({"score_threshold": "high"}, "ranking_options.score_threshold", "invalid_type"),
        ({"rerank": True}, "ranking_options.rerank", "unknown_parameter"),
        (
            {"hybrid_search": {"embedding_weight": 1}},
            "ranking_options.hybrid_search.text_weight",
            "missing_required_parameter",
        ),
        (
            {"hybrid_search": {"embedding_weight": -1, "text_weight": 1}},
            "ranking_options.hybrid_search.embedding_weight",
            "invalid_value",
        ),
        (
            {"hybrid_search": {"embedding_weight": 0, "text_weight": 0}},
            "ranking_options.hybrid_search",
            "invalid_value",
        ),
    ],
)
def test_wrong_ranking_options_are_400(raw: Any, param: str, code: str) -> None:
    with pytest.raises(errors.BadRequest) as exc:
        retrieval.parse_ranking_options(raw)
    assert (exc.value.param, exc.value.code) == (param, code)


@pytest.mark.django_db(transaction=True)
async def test_search_embeds_the_queries_upstream(upstream: Any, gateway_config: Callable[..., Any]) -> None:
    """The async entry point (the file_search tool's): ORM reads on ORM threads, the query embedded
    once by the embeddings server."""
    gateway_config(file_search__embedding_model=EMBEDDING_MODEL)
    upstream.word_vectors = 32

    def rows() -> str:
        store = make_store(model=EMBEDDING_MODEL, dimensions=32)
        for name, text in (("cats.txt", CATS), ("dogs.txt", DOGS), ("birds.txt", BIRDS)):
            add_file(store, name, [(text, word_vector(text, 32))], attributes={"name": name})
        return store.id

    store_id = await run_orm(rows)
    hits = await retrieval.search(
        owner="default",
        vector_store_ids=[store_id],
        queries=["where do birds build nests"],
        embed=embedder(upstream.url),
    )
    # The tool's arguments come raw: checked here, refusals under its own param prefix.
    not_cats = {"type": "ne", "key": "name", "value": "cats.txt"}
    filtered = await retrieval.search(
        owner="default",
        vector_store_ids=[store_id],
        queries=["cats and birds"],
        filters=not_cats,
        embed=embedder(upstream.url),
    )
    assert names(filtered)[0] == "birds.txt" and "cats.txt" not in names(filtered)
    for wrong, param in (
        ({"filters": {"type": "eq"}}, "tools[0].filters.key"),
        ({"max_num_results": 0}, "tools[0].max_num_results"),
        ({"ranking_options": {"ranker": 1}}, "tools[0].ranking_options.ranker"),
    ):
        with pytest.raises(errors.BadRequest) as exc:
            await retrieval.search(
                owner="default", vector_store_ids=[store_id], queries=["x"], param_prefix="tools[0].", **wrong
            )
        assert exc.value.param == param
    assert names(hits)[0] == "birds.txt"
    assert hits[0].score == 1.0  # first in both rankings
    # One embedding call per search; none for a refused one.
    assert [r.json()["input"] for r in upstream.requests if r.path == "/v1/embeddings"] == [
        ["where do birds build nests"],
        ["cats and birds"],
    ]
