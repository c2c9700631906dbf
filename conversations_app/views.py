"""The Conversations API (OpenAI-compatible): thin async views over services and selectors.

Plain async Django views with ``gateway.http`` rather than DRF: the bodies are validated by our
own schemas into OpenAI's error envelopes (DRF's parsers and serializers would add a second,
differently-worded error path), the 405/JSON handling is the one every other route uses, and the
ORM work of each request runs as one :func:`gateway.db.run_orm` call, side by side with other
requests' (never queued behind them on one thread).
"""

from __future__ import annotations

import inspect
from typing import Any

from django.http import HttpRequest, HttpResponse

from conversations_app import schemas, selectors, services
from conversations_app.models import Conversation, Item
from gateway import errors
from gateway.auth import require_stored_state_access
from gateway.db import run_orm
from gateway.http import allow_methods, json_response, parse_json_body
from gateway.principal import request_principal


def render_conversation(conversation: Conversation) -> dict[str, Any]:
    return {
        "id": conversation.id,
        "object": "conversation",
        "created_at": int(conversation.created_at.timestamp()),
        "metadata": conversation.metadata or {},
    }


def render_item_list(items: list[Item], *, has_more: bool, include: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [schemas.render_item(item.data, include) for item in items],
        "first_id": items[0].id if items else None,
        "last_id": items[-1].id if items else None,
        "has_more": has_more,
    }


async def _owner(request: HttpRequest) -> str:
    """The caller's owner key, after the stored-state access check (401 for a wrong API key)."""
    checked: Any = require_stored_state_access(request)  # type: ignore[func-returns-value]
    if inspect.isawaitable(checked):  # the auth branch may make the check async
        await checked
    return request_principal(request).owner


def _body(request: HttpRequest, *, allowed: tuple[str, ...]) -> dict[str, Any]:
    body: dict[str, Any] = parse_json_body(request)
    for key in body:
        if key not in allowed:
            raise errors.BadRequest(f"Unknown parameter: '{key}'.", param=key, code="unknown_parameter")
    return body


@allow_methods("POST")
async def conversations(request: HttpRequest) -> HttpResponse:
    """``POST /v1/conversations``: create, with up to 20 initial items, atomically."""
    owner = await _owner(request)
    body = _body(request, allowed=("items", "metadata"))
    items = schemas.validate_items(body.get("items"), required=False)
    metadata = schemas.validate_metadata(body.get("metadata"))
    conversation, _ = await run_orm(services.conversation_create, owner=owner, metadata=metadata, items=items)
    return json_response(render_conversation(conversation))


@allow_methods("GET", "POST", "DELETE")
async def conversation_detail(request: HttpRequest, conversation_id: str) -> HttpResponse:
    """``GET`` / ``POST`` (update metadata) / ``DELETE /v1/conversations/{id}``."""
    owner = await _owner(request)
    if request.method == "GET":
        conversation = await run_orm(selectors.conversation_get, id=conversation_id, owner=owner)
        return json_response(render_conversation(conversation))
    if request.method == "POST":
        selectors.check_conversation_id(conversation_id)
        body = _body(request, allowed=("metadata",))
        if "metadata" not in body:
            raise schemas.missing_parameter("metadata")
        metadata = schemas.validate_metadata(body["metadata"])
        conversation = await run_orm(
            services.conversation_update, id=conversation_id, owner=owner, metadata=metadata
        )
        return json_response(render_conversation(conversation))
    await run_orm(services.conversation_delete, id=conversation_id, owner=owner)
    return json_response({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


def _list_items(conversation_id: str, owner: str, params: schemas.ItemListParams) -> dict[str, Any]:
    conversation = selectors.conversation_get(id=conversation_id, owner=owner)
    page = selectors.conversation_items_list(
        conversation=conversation, after=params.after, limit=params.limit, order=params.order
    )
    return render_item_list(page.items, has_more=page.has_more, include=params.include)


@allow_methods("GET", "POST")
async def conversation_items(request: HttpRequest, conversation_id: str) -> HttpResponse:
    """``GET`` (list, keyset-paginated) / ``POST`` (append a batch) ``/v1/conversations/{id}/items``."""
    owner = await _owner(request)
    selectors.check_conversation_id(conversation_id)
    if request.method == "GET":
        params = schemas.parse_item_list_params(request.GET)
        return json_response(await run_orm(_list_items, conversation_id, owner, params))
    include = schemas.validate_include(schemas.query_include(request.GET))
    body = _body(request, allowed=("items",))
    items = schemas.validate_items(body.get("items"), required=True)
    stored = await run_orm(services.conversation_items_create, id=conversation_id, owner=owner, items=items)
    return json_response(render_item_list(stored, has_more=False, include=include))


def _get_item(conversation_id: str, owner: str, item_id: str) -> Item:
    conversation = selectors.conversation_get(id=conversation_id, owner=owner)
    return selectors.conversation_item_get(conversation=conversation, item_id=item_id)


@allow_methods("GET", "DELETE")
async def conversation_item(request: HttpRequest, conversation_id: str, item_id: str) -> HttpResponse:
    """``GET`` / ``DELETE`` (detach; returns the conversation) ``/v1/conversations/{id}/items/{item_id}``."""
    owner = await _owner(request)
    selectors.check_conversation_id(conversation_id)
    selectors.check_item_id(item_id)
    if request.method == "GET":
        include = schemas.validate_include(schemas.query_include(request.GET))
        item = await run_orm(_get_item, conversation_id, owner, item_id)
        return json_response(schemas.render_item(item.data, include))
    conversation = await run_orm(
        services.conversation_item_delete, id=conversation_id, owner=owner, item_id=item_id
    )
    return json_response(render_conversation(conversation))
