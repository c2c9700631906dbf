"""Search over the published chunks of vector stores: keyword, semantic and hybrid (docs/file-search.md
"Search").

- **keyword**: BM25 (``bm25s``, Lucene's variant, English stop words) over each store's chunks,
  ranked in Python, so SQLite and PostgreSQL give the same scores and order. A chunk's score is its
  BM25 score over the best score each query term reaches in the store (0..1).
- **semantic**: exact cosine similarity (numpy) between the query's embedding
  (``files_app.embeddings.embed``) and every chunk's, clipped to 0..1.
- **hybrid**: reciprocal rank fusion of the two rankings, ``w_e / (RRF_K + rank_e) + w_t / (RRF_K +
  rank_t)`` over each list's first ``RRF_DEPTH`` chunks, divided by its maximum ``(w_e + w_t) /
  (RRF_K + 1)`` so the chunk first in both lists scores 1.

Several queries: a chunk's score is its best over the queries. Several stores: each is ranked on its
own and the hits merged by score. Only chunks of ``completed`` store files are ever read.

A store's index (BM25 matrix, embedding matrix, chunk ids) is cached in memory under ``(store id,
revision)``: the revision grows with every change of its published chunks, so a replica never
serves a stale index; the cache is bounded by ``[file_search] index_cache_bytes`` (least recently
used first). Texts, filenames and attributes are read from the database for every search.
"""

from __future__ import annotations

import datetime
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import bm25s
import numpy as np
from django.utils import timezone

from files_app import services
from files_app.filters import Filter, parse_filters
from files_app.models import Chunk, VectorStore, VectorStoreFile
from gateway.core import errors
from gateway.core.config import get_config
from gateway.core.db import run_orm

Mode = Literal["keyword", "semantic", "hybrid"]
MODES: tuple[str, ...] = ("keyword", "semantic", "hybrid")
RANKERS = ("auto", "default-2024-11-15", "none")
MAX_NUM_RESULTS = 50
MAX_QUERIES = 16
# Reciprocal rank fusion (Cormack, Clarke & Büttcher, SIGIR 2009): 60 is their constant, the one
# most hybrid search engines use; ranks below RRF_DEPTH in a list add nothing from that list.
RRF_K = 60
RRF_DEPTH = 100
STOPWORDS = "en"
# A search moves its stores' last_active_at (and so expires_at) when it is older than this: one
# write a minute per store at most, not one per search (expiry is counted in days).
TOUCH_EVERY = datetime.timedelta(seconds=60)
COMPLETED = VectorStoreFile.Status.COMPLETED

EmbedFn = Callable[[list[str]], Awaitable[list[list[float]]]]


# ------------------------------------------------------------------------------------- results
@dataclass
class Hit:
    """One matching chunk, in the shape of OpenAI's ``VectorStoreSearchResponse`` (:meth:`to_dict`)."""

    file_id: str
    filename: str
    score: float
    attributes: dict[str, Any]
    content: list[dict[str, str]]
    vector_store_id: str = ""
    chunk_id: int = 0

    @property
    def text(self) -> str:
        return "".join(part["text"] for part in self.content)

    def to_dict(self) -> dict[str, Any]:
        return {
            "file_id": self.file_id,
            "filename": self.filename,
            "score": self.score,
            "attributes": self.attributes,
            "content": self.content,
        }


# ----------------------------------------------------------------------------- ranking options
@dataclass(frozen=True)
class RankingOptions:
    """``ranking_options``. No re-ranking model runs: the three ``ranker`` values rank alike.
    ``embedding_weight`` / ``text_weight`` (``hybrid_search``) weigh the fusion; a zero weight
    leaves that side out (``text_weight`` 0: semantic only, ``embedding_weight`` 0: keyword only)."""

    ranker: str = "auto"
    score_threshold: float = 0.0
    embedding_weight: float | None = None
    text_weight: float | None = None

    @property
    def mode(self) -> Mode | None:
        """The mode the weights ask for; ``None``: none asked (the store's default)."""
        if self.embedding_weight is None or self.text_weight is None:
            return None
        if self.text_weight == 0:
            return "semantic"
        if self.embedding_weight == 0:
            return "keyword"
        return "hybrid"


def _number(raw: dict[str, Any], key: str, param: str) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise errors.invalid_type(f"{param}.{key}", "a number", value)
    return float(value)


def _unknown(raw: dict[str, Any], allowed: tuple[str, ...], param: str) -> None:
    for key in raw:
        if key not in allowed:
            raise errors.BadRequest(
                f"Unknown parameter: '{param}.{key}'.", param=f"{param}.{key}", code="unknown_parameter"
            )


def parse_ranking_options(raw: Any, param: str = "ranking_options") -> RankingOptions:
    """``ranking_options`` of a search request or a ``file_search`` tool (``ranker``,
    ``score_threshold`` 0..1, ``hybrid_search`` {``embedding_weight``, ``text_weight``}); a wrong
    shape is a 400 naming the member."""
    if raw is None:
        return RankingOptions()
    if not isinstance(raw, dict):
        raise errors.invalid_type(param, "an object", raw)
    _unknown(raw, ("ranker", "score_threshold", "hybrid_search"), param)
    ranker = raw.get("ranker")
    if ranker is None:
        ranker = "auto"
    elif not isinstance(ranker, str):
        raise errors.invalid_type(f"{param}.ranker", "a string", ranker)
    elif ranker not in RANKERS:
        raise errors.invalid_value(f"{param}.ranker", ranker, RANKERS)
    threshold = _number(raw, "score_threshold", param)
    if threshold is not None and not 0 <= threshold <= 1:
        raise errors.BadRequest(
            f"Invalid '{param}.score_threshold': expected a number between 0 and 1, but got {threshold:g}.",
            param=f"{param}.score_threshold",
            code="invalid_value",
        )
    embedding_weight = text_weight = None
    hybrid = raw.get("hybrid_search")
    if hybrid is not None:
        where = f"{param}.hybrid_search"
        if not isinstance(hybrid, dict):
            raise errors.invalid_type(where, "an object", hybrid)
        _unknown(hybrid, ("embedding_weight", "text_weight"), where)
        for key in ("embedding_weight", "text_weight"):
            if key not in hybrid:
                raise errors.missing_parameter(f"{where}.{key}")
        embedding_weight = _number(hybrid, "embedding_weight", where)
        text_weight = _number(hybrid, "text_weight", where)
        for key, weight in (("embedding_weight", embedding_weight), ("text_weight", text_weight)):
            if weight is None or weight < 0:
                raise errors.BadRequest(
                    f"Invalid '{where}.{key}': expected a number >= 0.",
                    param=f"{where}.{key}",
                    code="invalid_value",
                )
        if embedding_weight == 0 and text_weight == 0:
            raise errors.BadRequest(
                f"Invalid '{where}': at least one of the weights must be above 0.",
                param=where,
                code="invalid_value",
            )
    return RankingOptions(
        ranker=ranker,
        score_threshold=threshold or 0.0,
        embedding_weight=embedding_weight,
        text_weight=text_weight,
    )


def check_max_num_results(raw: Any, param: str = "max_num_results") -> int:
    """``max_num_results`` (1 to 50; ``None``: 10), or the 400 naming ``param``."""
    if raw is None:
        return 10
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise errors.invalid_type(param, "an integer", raw)
    if raw < 1:
        raise errors.BadRequest(
            f"Invalid '{param}': integer below minimum value. Expected a value >= 1, but got {raw} instead.",
            param=param,
            code="integer_below_min_value",
        )
    if raw > MAX_NUM_RESULTS:
        raise errors.BadRequest(
            f"Invalid '{param}': integer above maximum value. Expected a value <= {MAX_NUM_RESULTS}, "
            f"but got {raw} instead.",
            param=param,
            code="integer_above_max_value",
        )
    return raw


# ------------------------------------------------------------------------------------ the index
def new_tokenizer() -> bm25s.tokenization.Tokenizer:
    """BM25's terms: lower-cased words of two characters or more, English stop words left out."""
    return bm25s.tokenization.Tokenizer(stopwords=STOPWORDS)


@dataclass
class StoreIndex:
    """A store's published chunks as of one revision, ready to rank."""

    chunk_ids: np.ndarray  # int64, the Chunk primary keys, in index order
    store_file_ids: np.ndarray  # int64, each chunk's VectorStoreFile
    bm25: bm25s.BM25 | None  # None: no chunk has a term
    tokenizer: bm25s.tokenization.Tokenizer  # the store's vocabulary (a query reads it, never grows it)
    term_max: np.ndarray  # float32, each term's best score in the store (the keyword scale)
    vectors: np.ndarray | None  # float32 (chunks x dimensions), rows of unit length; None: no embeddings
    nbytes: int = 0

    def __len__(self) -> int:
        return len(self.chunk_ids)

    def keyword_scores(self, query: str) -> np.ndarray:
        """Each chunk's BM25 score for ``query`` over the best it could reach (0..1)."""
        scores = np.zeros(len(self), dtype=np.float32)
        if self.bm25 is None:
            return scores
        empty = self.tokenizer.word_to_id.get("")  # what a document without terms holds
        (found,) = self.tokenizer.tokenize([query], update_vocab=False, return_as="ids", show_progress=False)
        ids = [i for i in found if i != empty]
        if not ids:
            return scores
        scale = float(self.term_max[ids].sum())
        raw: np.ndarray = self.bm25.get_scores_from_ids(ids)
        return np.clip(raw / scale, 0.0, 1.0).astype(np.float32) if scale > 0 else scores

    def semantic_scores(self, vector: np.ndarray) -> np.ndarray:
        """Each chunk's cosine similarity to the unit ``vector``, clipped to 0..1."""
        assert self.vectors is not None
        # einsum's own loop, not BLAS: OpenBLAS's threads cost ~10 ms per small product on a busy
        # 2-core machine (docs/file-search.md "Limits"); one thread per search scales across searches.
        return np.clip(np.einsum("ij,j->i", self.vectors, vector), 0.0, 1.0)


def _build_index(store_id: str, dimensions: int | None) -> StoreIndex:
    chunk_ids: list[int] = []
    store_file_ids: list[int] = []
    corpus: list[list[int]] = []
    tokenizer = new_tokenizer()
    vectors: list[np.ndarray] = []
    rows = (
        Chunk.objects.filter(vector_store_id=store_id, store_file__status=COMPLETED)
        .order_by("id")
        .values_list("id", "store_file_id", "text", "embedding")
    )
    batch: list[str] = []
    limit = get_config().file_search.max_chunks_per_store
    if rows.count() > limit:  # counted before any row is read: an oversized store costs one query
        raise errors.BadRequest(
            f"Vector store '{store_id}' holds more than {limit} chunks, the most one store may hold "
            "for exact search ([file_search] max_chunks_per_store).",
            code="vector_store_too_large",
        )
    for chunk_id, store_file_id, text, embedding in rows.iterator(chunk_size=2000):
        chunk_ids.append(chunk_id)
        store_file_ids.append(store_file_id)
        batch.append(text)
        if len(batch) == 2000:
            corpus.extend(tokenizer.tokenize(batch, update_vocab=True, return_as="ids", show_progress=False))
            batch = []
        if dimensions:
            vector = np.frombuffer(embedding, dtype="<f4") if embedding is not None else None
            vectors.append(
                vector
                if vector is not None and len(vector) == dimensions
                else np.zeros(dimensions, np.float32)
            )
    if batch:
        corpus.extend(tokenizer.tokenize(batch, update_vocab=True, return_as="ids", show_progress=False))
    bm25: bm25s.BM25 | None = None
    term_max = np.zeros(0, dtype=np.float32)
    if len(tokenizer.word_to_id) > 1:  # a term besides the empty one
        bm25 = bm25s.BM25(method="lucene")
        bm25.index((corpus, tokenizer.get_vocab_dict()), show_progress=False)
        data, indptr = bm25.scores["data"], bm25.scores["indptr"]
        postings = np.diff(indptr) > 0
        term_max = np.zeros(len(postings), dtype=np.float32)
        term_max[postings] = np.maximum.reduceat(data, indptr[:-1][postings])
    matrix: np.ndarray | None = None
    if dimensions and vectors:
        matrix = np.vstack(vectors).astype(np.float32)
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        matrix /= np.where(norms > 0, norms, 1.0)
    index = StoreIndex(
        chunk_ids=np.asarray(chunk_ids, dtype=np.int64),
        store_file_ids=np.asarray(store_file_ids, dtype=np.int64),
        bm25=bm25,
        tokenizer=tokenizer,
        term_max=term_max,
        vectors=matrix,
    )
    index.nbytes = _index_bytes(index)
    return index


def _index_bytes(index: StoreIndex) -> int:
    size = index.chunk_ids.nbytes + index.store_file_ids.nbytes + index.term_max.nbytes
    if index.vectors is not None:
        size += index.vectors.nbytes
    if index.bm25 is not None:
        size += sum(
            a.nbytes
            for a in (index.bm25.scores["data"], index.bm25.scores["indices"], index.bm25.scores["indptr"])
        )
        size += 200 * len(index.bm25.vocab_dict)  # the index's and the tokenizer's entries, roughly
    return size


class IndexCache:
    """Store indexes under ``(store id, revision)``, least recently used out first past
    ``max_bytes``; one build per key at a time."""

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[str, int], StoreIndex] = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[tuple[str, int], threading.Lock] = {}
        self.builds = 0  # how many indexes were built (tests, the bench)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._entries.values())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def get(self, store: VectorStore) -> StoreIndex:
        key = (store.id, store.revision)
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found
            build_lock = self._building.setdefault(key, threading.Lock())
        with build_lock:
            with self._lock:
                found = self._entries.get(key)
            if found is not None:
                return found
            try:
                index = _build_index(store.id, store.embedding_dimensions if store.embedding_model else None)
            finally:
                with self._lock:
                    self._building.pop(key, None)
            self.builds += 1
            # Cached only when the revision did not move while the chunks were read: otherwise the
            # rows may be newer than the key says (they still answer this search).
            current = VectorStore.objects.filter(id=store.id).values_list("revision", flat=True).first()
            with self._lock:
                if current == store.revision:
                    for old in [k for k in self._entries if k[0] == store.id]:
                        del self._entries[old]
                    self._entries[key] = index
                    self._shrink(get_config().file_search.index_cache_bytes)
            return index

    def _shrink(self, limit: int) -> None:
        total = sum(e.nbytes for e in self._entries.values())
        while total > limit and len(self._entries) > 1:
            _, evicted = self._entries.popitem(last=False)
            total -= evicted.nbytes


cache = IndexCache()


# ------------------------------------------------------------------------------------- searching
class StoreNotFound(errors.NotFound):
    """OpenAI answers an unknown vector store id with ``code: null``."""

    code = None  # type: ignore[assignment]


@dataclass
class StorePlan:
    store: VectorStore
    mode: Mode


@dataclass
class Search:
    """A checked search: its stores (owned, each with its mode) and what it asks."""

    stores: list[StorePlan]
    queries: list[str]
    max_num_results: int
    filters: Filter | None
    options: RankingOptions
    explicit: bool  # the request asked for its mode: a store that cannot serve it is a 400
    param: str  # where the request's ranking options live, for a refusal
    needs_embeddings: bool = field(init=False)

    def __post_init__(self) -> None:
        self.needs_embeddings = any(p.mode != "keyword" for p in self.stores)


def _refuse_semantic(store: VectorStore, model: str, param: str) -> errors.BadRequest:
    if not model:
        reason = "this gateway has no [file_search] embedding_model"
    elif not store.embedding_model:
        reason = f"vector store '{store.id}' was built for keyword search only"
    else:
        reason = (
            f"vector store '{store.id}' was built with embedding model '{store.embedding_model}', "
            f"not the configured '{model}'"
        )
    return errors.BadRequest(
        f"Semantic search is not available: {reason}. Search it with keyword ranking "
        "(hybrid_search.embedding_weight 0) or leave ranking_options.hybrid_search out.",
        param=param,
        code="embedding_model_mismatch",
    )


def prepare(
    *,
    owner: str,
    vector_store_ids: Sequence[str],
    queries: Sequence[str],
    max_num_results: int = 10,
    filters: Filter | dict[str, Any] | None = None,
    ranking_options: RankingOptions | dict[str, Any] | None = None,
    mode: Mode | None = None,
    param_prefix: str = "",
    store_params: Sequence[str | None] | None = None,
) -> Search:
    """Check a search and resolve its stores (synchronous ORM work). A store the owner does not have is
    a 404 whose ``param`` is ``store_params[i]`` (``None``: the id came in the URL)."""
    max_num_results = check_max_num_results(max_num_results, f"{param_prefix}max_num_results")
    if filters is not None and not isinstance(filters, Filter):
        filters = parse_filters(filters, f"{param_prefix}filters")
    options = (
        ranking_options
        if isinstance(ranking_options, RankingOptions)
        else parse_ranking_options(ranking_options, f"{param_prefix}ranking_options")
    )
    options_param = f"{param_prefix}ranking_options" + (".hybrid_search" if options.mode else "")
    requested = mode or options.mode
    # An id holding U+0000 names no store (and PostgreSQL could not even compare it).
    wanted = [i for i in vector_store_ids if "\x00" not in i]
    found = {s.id: s for s in VectorStore.objects.filter(id__in=wanted, owner=owner)}
    model = get_config().file_search.embedding_model
    now = timezone.now()
    plans: list[StorePlan] = []
    for i, store_id in enumerate(vector_store_ids):
        store = found.get(store_id)
        if store is None:
            param = store_params[i] if store_params is not None else None
            raise StoreNotFound(f"No vector store found with id '{store_id}'.", param=param)
        if store.expires_at is not None and store.expires_at <= now:
            param = store_params[i] if store_params is not None else None
            raise errors.BadRequest(
                f"Vector store with id '{store.id}' has expired.", param=param, code="expired"
            )
        embedded = bool(model) and store.embedding_model == model and bool(store.embedding_dimensions)
        if requested is None:
            plans.append(StorePlan(store, "hybrid" if embedded else "keyword"))
        elif requested != "keyword" and not embedded:
            raise _refuse_semantic(store, model, options_param)
        else:
            plans.append(StorePlan(store, requested))
    return Search(
        stores=plans,
        queries=list(queries),
        max_num_results=max_num_results,
        filters=filters,
        options=options,
        explicit=requested is not None,
        param=options_param,
    )


def _unit(vector: Sequence[float]) -> np.ndarray:
    array = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(array))
    return array / norm if norm > 0 else array


def _top(scores: np.ndarray, mask: np.ndarray, depth: int) -> np.ndarray:
    """Indexes of the ``depth`` best positive scores among ``mask``, best first (ties: index order)."""
    candidates = np.flatnonzero(mask & (scores > 0))
    if len(candidates) > depth:
        part = np.argpartition(-scores[candidates], depth - 1)[:depth]
        candidates = candidates[part]
    order = np.lexsort((candidates, -scores[candidates]))
    return candidates[order]


def _fuse(keyword: np.ndarray, semantic: np.ndarray, mask: np.ndarray, options: RankingOptions) -> np.ndarray:
    w_e = 1.0 if options.embedding_weight is None else options.embedding_weight
    w_t = 1.0 if options.text_weight is None else options.text_weight
    fused = np.zeros(len(keyword), dtype=np.float64)
    for weight, scores in ((w_t, keyword), (w_e, semantic)):
        if weight > 0:
            ranked = _top(scores, mask, RRF_DEPTH)
            fused[ranked] += weight / (RRF_K + 1 + np.arange(len(ranked)))
    return (fused / ((w_e + w_t) / (RRF_K + 1))).astype(np.float32)


def _allowed_files(store_id: str, filters: Filter) -> set[int]:
    rows = VectorStoreFile.objects.filter(vector_store_id=store_id, status=COMPLETED).values_list(
        "id", "attributes"
    )
    return {pk for pk, attributes in rows if filters.matches(attributes or {})}


def execute(search: Search, query_vectors: Sequence[Sequence[float]] | None = None) -> list[Hit]:
    """Rank ``search`` (synchronous: ORM reads and numpy); ``query_vectors``: the queries' embeddings
    when :attr:`Search.needs_embeddings`."""
    units = [_unit(v) for v in query_vectors] if query_vectors is not None else []
    found: list[tuple[float, int, int, str]] = []  # (score, store order, chunk id, store id)
    now = timezone.now()
    for order, plan in enumerate(search.stores):
        if now - plan.store.last_active_at > TOUCH_EVERY:
            services.vector_store_touch(plan.store)  # a search is activity: expires_at moves along
        index = cache.get(plan.store)
        if not len(index):
            continue
        mode = plan.mode
        if mode != "keyword" and (
            index.vectors is None or not units or index.vectors.shape[1] != len(units[0])
        ):
            if search.explicit:
                raise errors.BadRequest(
                    f"Semantic search is not available: the query embeddings do not match vector store "
                    f"'{plan.store.id}' ({plan.store.embedding_dimensions} dimensions).",
                    param=search.param,
                    code="embedding_model_mismatch",
                )
            mode = "keyword"
        mask = np.ones(len(index), dtype=bool)
        if search.filters is not None:
            allowed = _allowed_files(plan.store.id, search.filters)
            mask = np.isin(index.store_file_ids, np.fromiter(allowed, dtype=np.int64, count=len(allowed)))
        best = np.zeros(len(index), dtype=np.float32)
        for i, query in enumerate(search.queries):
            if mode == "keyword":
                scores = index.keyword_scores(query)
            elif mode == "semantic":
                scores = index.semantic_scores(units[i])
            else:
                scores = _fuse(
                    index.keyword_scores(query), index.semantic_scores(units[i]), mask, search.options
                )
            np.maximum(best, np.where(mask, scores, 0), out=best)
        threshold = search.options.score_threshold
        for position in _top(best, best >= threshold, search.max_num_results):
            found.append((float(best[position]), order, int(index.chunk_ids[position]), plan.store.id))
    found.sort(key=lambda f: (-f[0], f[1], f[2]))
    found = found[: search.max_num_results]
    return _hits(found)


def _hits(found: list[tuple[float, int, int, str]]) -> list[Hit]:
    """The hits' texts, filenames and attributes, read now: a chunk unpublished since the index was
    built is left out."""
    rows = {
        row["id"]: row
        for row in Chunk.objects.filter(id__in=[f[2] for f in found], store_file__status=COMPLETED).values(
            "id", "text", "file_id", "store_file__attributes", "store_file__file__filename"
        )
    }
    hits = []
    for score, _, chunk_id, store_id in found:
        row = rows.get(chunk_id)
        if row is None:
            continue
        hits.append(
            Hit(
                file_id=row["file_id"],
                filename=row["store_file__file__filename"],
                score=round(score, 6),
                attributes=row["store_file__attributes"] or {},
                content=[{"type": "text", "text": row["text"]}],
                vector_store_id=store_id,
                chunk_id=chunk_id,
            )
        )
    return hits


async def embed_queries(queries: list[str]) -> list[list[float]]:
    """The queries' embeddings from the configured embedding model (``files_app.embeddings``)."""
    from files_app import embeddings

    return await embeddings.embed(queries, get_config())


async def search(
    *,
    owner: str,
    vector_store_ids: Sequence[str],
    queries: Sequence[str],
    max_num_results: int = 10,
    filters: Filter | dict[str, Any] | None = None,
    ranking_options: RankingOptions | dict[str, Any] | None = None,
    mode: Mode | None = None,
    param_prefix: str = "",
    store_params: Sequence[str | None] | None = None,
    embed: EmbedFn | None = None,
) -> list[Hit]:
    """The best ``max_num_results`` chunks of the owner's ``vector_store_ids`` for ``queries``
    (best first). ``filters`` and ``ranking_options``: parsed (:func:`files_app.filters.parse_filters`,
    :func:`parse_ranking_options`) or raw (checked here, 400s under ``param_prefix``); ``mode``: ``None`` lets each store choose
    (hybrid where it was built with the configured embedding model, keyword otherwise)."""
    prepared = await run_orm(
        prepare,
        owner=owner,
        vector_store_ids=vector_store_ids,
        queries=queries,
        max_num_results=max_num_results,
        filters=filters,
        ranking_options=ranking_options,
        mode=mode,
        param_prefix=param_prefix,
        store_params=store_params,
    )
    vectors = await (embed or embed_queries)(list(queries)) if prepared.needs_embeddings else None
    return await run_orm(execute, prepared, vectors)
