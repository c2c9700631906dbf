"""Reads of stored responses, items and events. Every read filters by owner."""

from __future__ import annotations

from typing import Any

from conversations_app.models import Item
from gateway.core import errors
from responses_app.engine.tool_loop import PRIVATE_KEY
from responses_app.models import Response, ResponseEvent


def response_get(*, id: str, owner: str) -> Response:
    """The owner's response; unknown or another owner's → 404."""
    response = Response.objects.filter(id=id, owner=owner).first()
    if response is None:
        raise errors.NotFound(f"Response with id '{id}' not found.", param="response_id")
    return response


def items_in_order(*, ids: list[str], owner: str) -> list[Item]:
    """Stored items by id, in the order of ``ids`` (one query however long the history)."""
    if not ids:
        return []
    by_id = {item.id: item for item in Item.objects.filter(id__in=ids, owner=owner)}
    return [by_id[i] for i in ids if i in by_id]


def snapshot_file_search_results(*, snapshot: dict[str, Any], owner: str, include: bool) -> dict[str, Any]:
    """``snapshot`` as a retrieve returns it: each ``file_search_call``'s ``results`` read from its
    stored item (where the tool loop keeps them) when ``include`` asks for them, else null, whatever
    the create asked for (``include`` applies to each request that returns the response)."""
    output = snapshot.get("output")
    if not isinstance(output, list):
        return snapshot
    ids = [
        i["id"] for i in output if isinstance(i, dict) and i.get("type") == "file_search_call" and "id" in i
    ]
    if not ids:
        return snapshot
    stored = {item.id: item.data for item in items_in_order(ids=ids, owner=owner)} if include else {}
    filled = []
    for item in output:
        if isinstance(item, dict) and item.get("id") in ids:
            data = stored.get(item["id"])
            view = data.get(PRIVATE_KEY) if isinstance(data, dict) else None
            results = view.get("results") if isinstance(view, dict) else None
            item = {**item, "results": results if isinstance(results, list) else None}
        filled.append(item)
    return {**snapshot, "output": filled}


def response_input_items(
    *, response: Response, after: str | None, limit: int, order: str
) -> tuple[list[dict[str, Any]], bool]:
    """A page of the response's input items (``order`` asc or desc) and whether more follow."""
    ids = list(response.history_item_ids[: response.input_item_count])
    if order == "desc":
        ids.reverse()
    if after is not None:
        if after not in ids:
            raise errors.NotFound(f"Item with id '{after}' not found.", param="after")
        ids = ids[ids.index(after) + 1 :]
    page_ids = ids[: limit + 1]
    items = items_in_order(ids=page_ids[:limit], owner=response.owner)
    return [item.data for item in items], len(page_ids) > limit


def response_events_after(*, response_id: str, after: int) -> list[ResponseEvent]:
    return list(
        ResponseEvent.objects.filter(response_id=response_id, sequence_number__gt=after).order_by(
            "sequence_number"
        )
    )


def response_status(*, id: str) -> str | None:
    return Response.objects.filter(id=id).values_list("status", flat=True).first()
