"""The ``file_search`` gateway tool: the request's vector stores searched for the model's queries.

The declaration is checked in two steps, both before any work: :func:`check_declaration` (its
shape, on every route) and :func:`check_stores` (the stores exist and belong to the caller; it reads
the database). A call runs in the gateway process, never on a Celery ``tools`` worker: retrieval is
a few database queries (plus an embedding request), the rows are the principal's own, and a task
round trip would only add latency and put the owner in a broker message.

The model reads the passages with their file ids and filenames, and cites one by writing
``[cite:<file_id>]`` (:data:`CITATION_MARKER`); the Responses emitter turns such markers into
``file_citation`` annotations.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from django.utils import timezone

from gateway.core import errors
from gateway.core.config import Config
from inference_app.tools.base import ToolCall, ToolResult

MAX_NUM_RESULTS = 50
DEFAULT_MAX_NUM_RESULTS = 20
MAX_QUERIES_PER_CALL = 10
DECLARATION_FIELDS = frozenset({"type", "vector_store_ids", "max_num_results", "filters", "ranking_options"})

# ``[cite:file-abc]``: what the model writes after a statement to cite a result (docs/tools.md).
CITATION_MARKER = re.compile(r"\[cite:([A-Za-z0-9_-]{1,64})\]")
CITATION_HELP = (
    "To cite a result, write [cite:<file_id>] with its file_id right after the statement it supports, "
    "for example: The launch is planned for May[cite:file-abc123]."
)


# --- the declaration -------------------------------------------------------------------------------


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_declaration(tool: Mapping[str, Any], param: str) -> None:
    """The shape of a ``file_search`` declaration (400 naming the field); no database access."""
    for key in tool:
        if key not in DECLARATION_FIELDS:
            raise errors.BadRequest(
                f"Unknown parameter: '{param}.{key}'.", param=f"{param}.{key}", code="unknown_parameter"
            )
    ids = tool.get("vector_store_ids")
    where = f"{param}.vector_store_ids"
    if ids is None:
        raise errors.missing_parameter(where)
    if not isinstance(ids, list):
        raise errors.invalid_type(where, "an array", ids)
    if not ids:
        raise errors.BadRequest(
            f"Invalid '{where}': empty array. Expected an array with minimum length 1, but got an "
            "empty array instead.",
            param=where,
            code="empty_array",
        )
    for index, value in enumerate(ids):
        if not isinstance(value, str):
            raise errors.invalid_type(f"{where}[{index}]", "a string", value)
    limit = tool.get("max_num_results")
    where = f"{param}.max_num_results"
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise errors.invalid_type(where, "an integer", limit)
        if limit < 1:
            raise errors.BadRequest(
                f"Invalid '{where}': integer below minimum value. Expected a value >= 1, but got "
                f"{limit} instead.",
                param=where,
                code="integer_below_min_value",
            )
        if limit > MAX_NUM_RESULTS:
            raise errors.BadRequest(
                f"Invalid '{where}': integer above maximum value. Expected a value <= "
                f"{MAX_NUM_RESULTS}, but got {limit} instead.",
                param=where,
                code="integer_above_max_value",
            )
    from files_app import filters, retrieval

    # The search endpoint's own parsers: the same 400s, under this tool's path.
    filters.parse_filters(tool.get("filters"), f"{param}.filters")
    retrieval.parse_ranking_options(tool.get("ranking_options"), f"{param}.ranking_options")


def check_stores(tools: Sequence[Any] | None, owner: str) -> None:
    """Every ``file_search`` tool's stores exist, belong to ``owner``, have not expired and can serve
    the ranking asked for (a 404 or 400 naming ``tools[i].vector_store_ids[j]`` or the option).
    Synchronous: it reads the database."""
    for index, tool in enumerate(tools or ()):
        if not isinstance(tool, Mapping) or tool.get("type") != "file_search":
            continue
        from files_app import retrieval  # its numpy and bm25s only once a request needs them

        ids = [i for i in tool.get("vector_store_ids") or () if isinstance(i, str)]
        params = [f"tools[{index}].vector_store_ids[{position}]" for position in range(len(ids))]
        plan = retrieval.prepare(
            owner=owner,
            vector_store_ids=ids,
            queries=[],
            ranking_options=tool.get("ranking_options"),
            param_prefix=f"tools[{index}].",
            store_params=params,
        )
        now = timezone.now()
        for param, planned in zip(params, plan.stores, strict=True):
            store = planned.store
            if store.expires_at is not None and store.expires_at <= now:
                raise errors.BadRequest(
                    f"Vector store with id '{store.id}' has expired.", param=param, code="expired"
                )


# --- a call --------------------------------------------------------------------------------------


def queries_of(arguments: str) -> list[str]:
    """The queries of the model's arguments (``queries``, or a lone ``query``); [] when malformed."""
    call = ToolCall(call_id="", name="", kind="file_search", arguments=arguments)
    try:
        value = call.parsed_arguments()
    except ValueError:
        return []
    queries = value.get("queries")
    if queries is None and isinstance(value.get("query"), str):
        queries = [value["query"]]
    if isinstance(queries, str):
        queries = [queries]
    if not isinstance(queries, list):
        return []
    return [q for q in queries if isinstance(q, str) and q.strip()]


def _field(hit: Any, name: str) -> Any:
    return hit.get(name) if isinstance(hit, Mapping) else getattr(hit, name, None)


def result_of(hit: Any) -> dict[str, Any]:
    """One retrieval hit as a ``file_search_call`` result: ``{file_id, filename, score, attributes, text}``."""
    content = _field(hit, "content") or ()
    texts = [str(_field(part, "text") or "") for part in content]
    score = _field(hit, "score")
    return {
        "file_id": str(_field(hit, "file_id")),
        "filename": str(_field(hit, "filename") or ""),
        "score": float(score) if _number(score) else None,
        "attributes": dict(_field(hit, "attributes") or {}),
        "text": "\n".join(texts),
    }


def model_output(queries: Sequence[str], results: Sequence[Mapping[str, Any]]) -> str:
    """What the model reads: each passage with its file id and filename, and how to cite one."""
    asked = ", ".join(f'"{q}"' for q in queries)
    if not results:
        return f"No results found in the files for {asked}."
    lines = [f"{len(results)} results from the files for {asked}. {CITATION_HELP}", ""]
    for number, result in enumerate(results, 1):
        lines.append(
            f'<result index="{number}" file_id="{result.get("file_id")}" filename="{result.get("filename")}">'
        )
        lines.append(str(result.get("text") or ""))
        lines.append("</result>")
    return "\n".join(lines)


async def run_file_search(call: ToolCall, config: Config) -> ToolResult:
    """Search the declared stores (``call.tool``) of ``call.owner`` for the model's queries."""
    from files_app import filters, retrieval

    queries = queries_of(call.arguments)
    if not queries:
        return ToolResult.failure(
            call, "file_search needs 'queries': a non-empty array of strings.", queries=[]
        )
    if len(queries) > MAX_QUERIES_PER_CALL:
        return ToolResult.failure(
            call, f"file_search takes at most {MAX_QUERIES_PER_CALL} queries per call.", queries=queries
        )
    tool = call.tool
    hits = await retrieval.search(
        owner=call.owner,
        vector_store_ids=list(tool.get("vector_store_ids") or ()),
        queries=queries,
        max_num_results=tool.get("max_num_results") or DEFAULT_MAX_NUM_RESULTS,
        filters=filters.parse_filters(tool.get("filters")),  # checked when the request was prepared
        ranking_options=tool.get("ranking_options"),
    )
    results = [result_of(hit) for hit in hits]
    return ToolResult(
        call_id=call.call_id,
        kind="file_search",
        status="completed",
        output=model_output(queries, results),
        queries=queries,
        results=results,
    )
