"""Request preparation: what a response is validated against and continues from, before it runs.

Synchronous and read-only (the ids it mints are written with the response); async callers use
``gateway.core.db.run_orm``. :func:`response_prepare` is shared by HTTP, WebSocket and background runs.
"""

from __future__ import annotations

import time
from typing import Any

from conversations_app import selectors as conversation_selectors
from conversations_app.models import Item
from gateway.core import errors
from gateway.core.config import Config
from gateway.core.ids import new_id
from gateway.core.principal import Principal
from inference_app.tools.file_search import check_stores
from inference_app.upstream import lineage
from responses_app.engine import translate
from responses_app.engine.domain import Prepared
from responses_app.engine.tool_loop import PRIVATE_KEY, web_search_available
from responses_app.features import async_tools
from responses_app.models import Response
from responses_app.protocol.features import refuse_executor_only
from responses_app.protocol.multi_agent_config import AGENT_ITEM_TYPES, INPUT_MARK, refuse_in_multi_agent_mode
from responses_app.protocol.schemas import NOT_FORWARDED, ResponseCreateRequest, check_prompt_cache_options
from responses_app.storage import rawsql, selectors
from responses_app.storage.history_cache import history_cache
from responses_app.storage.input_files import resolve_input_files, wants_files

COMPACTION_TYPES = frozenset({"compaction", "compaction_trigger"})
# Input items only the executor can serve: compaction and client tool-search state.
# Multi-agent items too: the executor drops them from the model's input (never sent raw upstream).
# A file_search_call too: the model reads it as the function call and results the executor rebuilds.
EXECUTOR_ITEM_TYPES = (
    COMPACTION_TYPES | {"tool_search_call", "tool_search_output", "file_search_call"} | AGENT_ITEM_TYPES
)
# Gateway-owned fields vLLM's /v1/responses shares with the same meaning (store: false, stream, a null
# previous_response_id ...): the direct path may relay them. Any other gateway-owned field, present with
# any value, sends the request through the executor, which never forwards it (direct is byte for byte).
UPSTREAM_KNOWN = frozenset(
    {"background", "max_tool_calls", "metadata", "previous_response_id", "store", "stream"}
)
GATEWAY_OWNED = NOT_FORWARDED - UPSTREAM_KNOWN


def needs_executor(request: ResponseCreateRequest, raw: dict[str, Any], config: Config) -> bool:
    """False only for stateless requests the upstream's own ``/v1/responses`` can answer as is."""
    if config.upstream_api != "responses":
        return True  # a chat-only upstream cannot take a Responses body
    if request.store is not False or request.background:
        return True
    if request.previous_response_id is not None or request.conversation is not None:
        return True
    if not GATEWAY_OWNED.isdisjoint(raw):
        return True  # whatever their value ([] or enabled: false included): only the executor drops them
    if any(tool.get("type") != "function" for tool in request.tools or ()):
        return True
    if async_tools.needs_executor(request.tools, request.input):
        return True
    if wants_files(request.input):
        return True  # the upstream cannot resolve the gateway's file ids
    return isinstance(request.input, list) and any(
        item.get("type") in EXECUTOR_ITEM_TYPES for item in request.input
    )


def prepare_reads_database(request: ResponseCreateRequest) -> bool:
    """Whether :func:`response_prepare` consults stored state for ``request`` (else it can run on
    the event loop: nothing but validation and fresh ids)."""
    if request.previous_response_id is not None or request.conversation is not None:
        return True
    if any(isinstance(t, dict) and t.get("type") == "file_search" for t in request.tools or ()):
        return True  # its vector stores are checked
    if wants_files(request.input):
        return True
    return _references_items(request)


def _references_items(request: ResponseCreateRequest) -> bool:
    if not isinstance(request.input, list):
        return False
    return any(isinstance(item, dict) and isinstance(item.get("id"), str) for item in request.input)


def response_prepare(
    *,
    request: ResponseCreateRequest,
    raw: dict[str, Any],
    owner: str,
    headers: dict[str, str],
    config: Config,
    response_id: str | None = None,
    created_at: int | None = None,
    cached_history: list[dict[str, Any]] | None = None,
    model_turn: bool = True,
    principal: Principal | None = None,
    request_id: str = "",
    cached_lineage: str | None = None,
) -> Prepared:
    """Validate against stored state and resolve the history this response continues from.

    ``cached_history`` is the checkpoint of ``previous_response_id`` when the caller holds it
    (the WebSocket transport's connection-local state); then the database is not consulted for it.
    ``model_turn`` False (``POST /v1/responses/compact``): the history is summarized, not answered,
    so the rules on tool calls and their outputs do not apply (a call may await its output).
    ``principal`` and ``request_id``: who the usage ledger charges (by default the owner alone) and
    for which request (by default the one the executor is built in). ``cached_lineage``: the lineage
    of the cached parent (with ``cached_history``).
    """
    if request.previous_response_id is not None and request.conversation is not None:
        raise errors.BadRequest(
            "Mutually exclusive parameters: Ensure you are only providing one of: "
            "'previous_response_id' or 'conversation'.",
            param=None,
            code="mutually_exclusive_parameters",
        )
    refuse_executor_only(raw)
    # Refused before any history lookup or inference (spec: prompt_cache_options).
    cache_options = check_prompt_cache_options(
        raw.get("prompt_cache_options"), supported=config.responses.prompt_cache_options_supported
    )
    if request.background and not request.stores:
        raise errors.BadRequest(
            "Background mode requires store=true.", param="background", code="invalid_value"
        )
    # Tool names the upstream will see; colliding names are refused before any lookup or inference.
    tool_map = translate.ToolMap.build(request.tools, search_available=web_search_available(config))

    history: list[dict[str, Any]] = []
    agent_tree: dict[str, Any] | None = None
    revision = 0
    parent_lineage = cached_lineage
    conversation_id = request.conversation_id
    if request.previous_response_id is not None and cached_history is not None:
        history = list(cached_history)
    elif request.previous_response_id is not None:
        history, agent_tree, parent_lineage = _previous_history(request.previous_response_id, owner)
    elif conversation_id is not None:
        conversation_selectors.check_conversation_id(conversation_id, param="conversation")
        try:
            stored, revision = conversation_selectors.conversation_history(
                conversation_id=conversation_id, owner=owner
            )
        except errors.NotFound as exc:
            exc.param = "conversation"  # on Responses the conversation is a request parameter
            raise
        history = [item.data for item in stored]

    check_stores(request.tools, owner)  # a file_search tool's stores: 404 before any lookup of history
    new_items, to_insert = _resolve_input(translate.normalize_input(request.input), owner)
    resolve_input_files(new_items, owner, config, PRIVATE_KEY)
    if cached_history is not None and request.stores:
        # A stored response continuing an in-memory (possibly unstored) parent: its checkpoint must
        # only reference stored items, so the parent's items are stored with it (duplicates ignored).
        to_insert = [*history, *to_insert]
    if agent_tree is not None and model_turn:
        # A multi-agent continuation inherits the tree's configuration, and its rules: the same
        # refusals as a fresh multi-agent request (max_tool_calls would count per agent otherwise).
        refuse_in_multi_agent_mode(raw)
    if model_turn:  # OpenAI's pairing rules; a pending async call may go unanswered (or be answered again)
        async_tools.check_tool_outputs(history, new_items, translate.CALL_TYPES)
    multi_agent = raw.get("multi_agent")
    if model_turn and (
        agent_tree is not None or (isinstance(multi_agent, dict) and multi_agent.get("enabled") is True)
    ):
        async_tools.check_multi_agent_outputs(history, new_items)
    tool_map.load([*history, *new_items])  # the tools a client tool search loaded become callable
    response_id = response_id or new_id("resp")
    return Prepared(
        request=request,
        raw=raw,
        owner=owner,
        response_id=response_id,
        created_at=created_at if created_at is not None else int(time.time()),
        history=history,
        new_items=new_items,
        items_to_insert=to_insert,
        store=request.stores,
        headers=headers,
        previous_response_id=request.previous_response_id,
        conversation_id=conversation_id,
        conversation_revision=revision,
        prompt_cache_options=cache_options,
        background=bool(request.background),
        tool_map=tool_map,
        agent_tree=agent_tree,
        principal=principal if principal is not None else Principal(owner=owner),
        request_id=request_id,
        lineage=response_lineage(request, owner, response_id, parent_lineage),
    )


def response_lineage(
    request: ResponseCreateRequest, owner: str, response_id: str, parent_lineage: str | None = None
) -> str:
    """The lineage of a response's model rounds (``inference_app.upstream.lineage``), in this order:
    the client's ``prompt_cache_key`` names it; a ``previous_response_id`` continuation keeps its
    parent's (a parent stored before lineages were starts one of its own); a conversation's responses
    share the conversation's; any other response starts its own. Scoped by the owner."""
    if request.prompt_cache_key:
        return prompt_cache_lineage(owner, request.prompt_cache_key)
    if request.previous_response_id is not None:
        return parent_lineage or lineage.key(owner, "response", request.previous_response_id)
    if request.conversation_id is not None:
        return lineage.key(owner, "conversation", request.conversation_id)
    return lineage.key(owner, "response", response_id)


def prompt_cache_lineage(owner: str, prompt_cache_key: str) -> str:
    """The lineage a client's ``prompt_cache_key`` names (the stateless direct path uses it too)."""
    return lineage.key(owner, "prompt_cache_key", prompt_cache_key)


def _previous_history(
    previous_id: str, owner: str
) -> tuple[list[dict[str, Any]], dict[str, Any] | None, str | None]:
    """The checkpoint items of the owner's finished response ``previous_id``, its agent tree
    (multi-agent responses; else None) and its lineage (None when stored before lineages were).

    The parent's row is always read (existence, owner, status: one indexed query), so deletes on
    any process and other owners' ids are honoured; only the items come from the in-process
    cache when it holds them.
    """
    cached = history_cache.get(previous_id, owner)
    found = rawsql.parent_row(previous_id, owner, with_item_ids=cached is None)
    if found is None:
        # OpenAI answers 400 for an unknown previous response; another owner's id is unknown.
        if cached is not None:
            history_cache.discard(previous_id)  # deleted by another process
        raise errors.BadRequest(
            f"Previous response with id '{previous_id}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    status = found.status
    if status in (Response.Status.QUEUED, Response.Status.IN_PROGRESS):
        raise errors.BadRequest(
            f"Previous response with id '{previous_id}' is still {status}; "
            "wait for it to finish before continuing it.",
            param="previous_response_id",
            code="previous_response_in_progress",
        )
    if cached is not None:
        return cached, found.agent_tree, found.lineage
    history = [item.data for item in selectors.items_in_order(ids=found.item_ids or [], owner=owner)]
    history_cache.put(previous_id, owner, history)
    return history, found.agent_tree, found.lineage


def _resolve_input(
    items: list[dict[str, Any]], owner: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Input items with our ids: stored items are referenced, new ones get a fresh id."""
    wanted = [item["id"] for item in items if isinstance(item.get("id"), str)]
    stored = {i.id: i for i in Item.objects.filter(id__in=wanted, owner=owner)} if wanted else {}
    resolved: list[dict[str, Any]] = []
    to_insert: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        if item.get("type") == "item_reference":
            ref = stored.get(item["id"])
            if ref is None:
                raise errors.BadRequest(
                    f"Item with id '{item['id']}' not found.",
                    param=f"input[{index}].id",
                    code="item_not_found",
                )
            resolved.append(ref.data)
            continue
        item_id = item.get("id")
        existing = stored.get(item_id) if isinstance(item_id, str) else None
        if existing is not None:
            resolved.append(existing.data)
            continue
        item = dict(item)
        item["id"] = translate.mint_item_id(item["type"])
        if item["type"] in AGENT_ITEM_TYPES:
            item[PRIVATE_KEY] = INPUT_MARK  # stored, never the model's (responses_app.features.multi_agent)
        if item["type"] == "message" and "status" not in item:
            item["status"] = "completed"
        resolved.append(item)
        to_insert.append(item)
    return resolved, to_insert
