"""``POST /v1/vector_stores/{vector_store_id}/search`` (OpenAI's contract; docs/file-search.md "Search").

The body is checked first (a 400 naming the member), then the store (another owner's id is a 404),
then ranked by :mod:`files_app.retrieval` on the ORM thread the view runs on; only the query
embedding, an HTTP call, goes to the event loop (:func:`gateway.core.drf.on_loop`).
"""

from __future__ import annotations

from typing import Any, Literal

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from pydantic import BaseModel, Field
from rest_framework.request import Request
from rest_framework.response import Response

from files_app import retrieval
from files_app.filters import parse_filters
from gateway.core import errors
from gateway.core.drf import ResourceView, on_loop
from gateway.core.http import parse_json_body
from gateway.core.openapi import ERROR_RESPONSES

TAGS = ["Vector stores"]
VECTOR_STORE_ID = OpenApiParameter("vector_store_id", OpenApiTypes.STR, OpenApiParameter.PATH)
FIELDS = ("query", "filters", "max_num_results", "ranking_options", "rewrite_query")


class SearchParams(BaseModel):
    """The request body (the OpenAPI document's; :func:`parse_search` checks it)."""

    query: str | list[str] = Field(description=f"A query, or up to {retrieval.MAX_QUERIES} of them.")
    filters: dict[str, Any] | None = Field(None, description="A comparison or compound attribute filter.")
    max_num_results: int = Field(10, ge=1, le=retrieval.MAX_NUM_RESULTS)
    ranking_options: dict[str, Any] | None = Field(
        None, description="ranker, score_threshold (0..1), hybrid_search {embedding_weight, text_weight}."
    )
    rewrite_query: bool = Field(False, description="Only false: queries are searched as given.")


class SearchResult(BaseModel):
    file_id: str
    filename: str
    score: float
    attributes: dict[str, str | float | bool] | None
    content: list[dict[str, str]]


class SearchResultsPage(BaseModel):
    object: Literal["vector_store.search_results.page"]
    search_query: list[str]
    data: list[SearchResult]
    has_more: bool
    next_page: str | None


def _queries(raw: Any) -> list[str]:
    if raw is None:
        raise errors.missing_parameter("query")
    queries = [raw] if isinstance(raw, str) else raw
    if not isinstance(queries, list):
        raise errors.invalid_type("query", "a string or an array", raw)
    if not queries:
        raise errors.BadRequest(
            "Invalid 'query': empty array. Expected an array with minimum length 1, but got an empty array instead.",
            param="query",
            code="empty_array",
        )
    if len(queries) > retrieval.MAX_QUERIES:
        raise errors.BadRequest(
            f"Invalid 'query': array too long. Expected an array with maximum length {retrieval.MAX_QUERIES}, "
            f"but got an array with length {len(queries)} instead.",
            param="query",
            code="array_above_max_length",
        )
    for i, query in enumerate(queries):
        param = "query" if isinstance(raw, str) else f"query[{i}]"
        if not isinstance(query, str):
            raise errors.invalid_type(param, "a string", query)
        if not query.strip():
            raise errors.BadRequest(
                f"Invalid '{param}': the query is empty.", param=param, code="invalid_value"
            )
    return queries


def parse_search(body: dict[str, Any]) -> dict[str, Any]:
    """The body's search arguments for :func:`files_app.retrieval.prepare`; anything wrong is a 400."""
    for key in body:
        if key not in FIELDS:
            raise errors.BadRequest(f"Unknown parameter: '{key}'.", param=key, code="unknown_parameter")
    errors.refuse_nul(body.get("query"), "query")
    queries = _queries(body.get("query"))
    rewrite = body.get("rewrite_query")
    if rewrite is not None and not isinstance(rewrite, bool):
        raise errors.invalid_type("rewrite_query", "a boolean", rewrite)
    if rewrite:
        raise errors.BadRequest(
            "rewrite_query is not supported: this gateway searches with the queries as given.",
            param="rewrite_query",
            code="unsupported_parameter",
        )
    return {
        "queries": queries,
        "max_num_results": retrieval.check_max_num_results(body.get("max_num_results"), "max_num_results"),
        "filters": parse_filters(body.get("filters"), "filters"),
        "ranking_options": retrieval.parse_ranking_options(body.get("ranking_options"), "ranking_options"),
    }


class VectorStoreSearchView(ResourceView):
    @extend_schema(
        operation_id="vector_stores_search",
        tags=TAGS,
        parameters=[VECTOR_STORE_ID],
        request=SearchParams,
        responses={200: SearchResultsPage, **ERROR_RESPONSES},
        examples=[
            OpenApiExample(
                "Recent English documents about returns",
                value={
                    "query": "What is the return policy?",
                    "max_num_results": 5,
                    "filters": {"type": "eq", "key": "lang", "value": "en"},
                },
                request_only=True,
            )
        ],
    )
    def post(self, request: Request, vector_store_id: str) -> Response:
        """Search a vector store's chunks by query and file attributes."""
        arguments = parse_search(parse_json_body(request))
        search = retrieval.prepare(owner=self.owner, vector_store_ids=[vector_store_id], **arguments)
        vectors = None
        if search.needs_embeddings:
            queries = arguments["queries"]
            vectors = on_loop(lambda: retrieval.embed_queries(queries))
        hits = retrieval.execute(search, vectors)
        return Response(
            {
                "object": "vector_store.search_results.page",
                "search_query": arguments["queries"],
                "data": [hit.to_dict() for hit in hits],
                "has_more": False,
                "next_page": None,
            }
        )
