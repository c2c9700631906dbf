"""Every read of conversations and their items. Each filters by owner: another owner's ids are 404."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import QuerySet

from conversations_app.models import Conversation, ConversationItem, Item
from conversations_app.schemas import invalid_id
from gateway.core import errors
from gateway.core.ids import has_prefix


class NotFound(errors.NotFound):
    """OpenAI answers unknown conversation and item ids with ``code: null``."""

    code = None  # type: ignore[assignment]


def check_conversation_id(conversation_id: str, *, param: str = "conversation_id") -> str:
    """A malformed id or another kind of id is a 400, before any lookup."""
    errors.refuse_nul(conversation_id, param)
    if not has_prefix(conversation_id, "conv") or len(conversation_id) > 128:
        raise invalid_id(param, conversation_id, "conv")
    return conversation_id


def check_item_id(item_id: str, *, param: str = "item_id") -> str:
    """Item ids carry a type prefix (``msg_``, ``fc_``, ``rs_`` …); anything else is a 400."""
    errors.refuse_nul(item_id, param)
    prefix, sep, _rest = item_id.partition("_")
    if not sep or not prefix.isalpha() or not prefix.islower() or len(item_id) > 128:
        raise errors.BadRequest(
            f"Invalid '{param}': '{item_id}'. Expected an ID that begins with an item type prefix "
            "such as 'msg_' or 'fc_'.",
            param=param,
            code="invalid_value",
        )
    return item_id


def conversation_not_found(conversation_id: str) -> NotFound:
    return NotFound(f"Conversation with id '{conversation_id}' not found.")


def item_not_found(item_id: str, *, param: str | None = None) -> NotFound:
    return NotFound(f"Item with id '{item_id}' not found.", param=param)


def conversation_get(*, id: str, owner: str) -> Conversation:
    check_conversation_id(id)
    conversation = Conversation.objects.filter(id=id, owner=owner).first()
    if conversation is None:
        raise conversation_not_found(id)
    return conversation


def conversation_list(*, owner: str) -> QuerySet[Conversation]:
    return Conversation.objects.filter(owner=owner).order_by("-created_at")


@dataclass(frozen=True)
class ItemPage:
    items: list[Item]
    has_more: bool


@dataclass(frozen=True)
class ItemDataPage:
    """A page of items as stored (each item's ``data``, the API's shape), for rendering only."""

    items: list[dict[str, Any]]
    has_more: bool


def _page_ids(conversation_id: str, *, after: str | None, limit: int, order: str) -> tuple[list[str], bool]:
    """One page of item ids by keyset on (conversation, position), after the item ``after``: no OFFSET,
    no count, no scan."""
    entries = ConversationItem.objects.filter(conversation_id=conversation_id)
    if after is not None:
        check_item_id(after, param="after")
        anchor = entries.filter(item_id=after).order_by("position").values_list("position", flat=True).first()
        if anchor is None:
            raise NotFound(f"No item found with id '{after}'", param="after")  # OpenAI's wording
        entries = (
            entries.filter(position__gt=anchor) if order == "asc" else entries.filter(position__lt=anchor)
        )
    ordering = "position" if order == "asc" else "-position"
    # Two statements on purpose: the page is one index range whatever the planner estimates; a join lets
    # a planner with stale statistics join a long conversation's items before cutting the page.
    rows = list(entries.order_by(ordering).values_list("item_id", flat=True)[: limit + 1])
    return rows[:limit], len(rows) > limit


def conversation_items_list(
    *,
    conversation: Conversation,
    after: str | None = None,
    limit: int = 20,
    order: str = "desc",
) -> ItemPage:
    """One page of the conversation's items (:func:`_page_ids`), as model instances."""
    page_ids, has_more = _page_ids(conversation.id, after=after, limit=limit, order=order)
    by_id = Item.objects.order_by().in_bulk(page_ids)
    return ItemPage(items=[by_id[item_id] for item_id in page_ids], has_more=has_more)


def conversation_item_data_list(
    *,
    conversation_id: str,
    owner: str,
    after: str | None = None,
    limit: int = 20,
    order: str = "desc",
) -> ItemDataPage:
    """:func:`conversation_items_list`'s page as each item's stored ``data`` (two columns, no model
    instances); another owner's conversation is a 404."""
    check_conversation_id(conversation_id)
    if not Conversation.objects.filter(id=conversation_id, owner=owner).exists():
        raise conversation_not_found(conversation_id)
    page_ids, has_more = _page_ids(conversation_id, after=after, limit=limit, order=order)
    by_id = dict(Item.objects.order_by().filter(pk__in=page_ids).values_list("id", "data"))
    return ItemDataPage(items=[by_id[item_id] for item_id in page_ids], has_more=has_more)


def conversation_item_get(*, conversation: Conversation, item_id: str) -> Item:
    check_item_id(item_id)
    entry = (
        ConversationItem.objects.filter(conversation=conversation, item_id=item_id)
        .select_related("item")
        .first()
    )
    if entry is None:
        raise item_not_found(item_id)
    return entry.item


def conversation_history(*, conversation_id: str, owner: str) -> tuple[list[Item], int]:
    """The conversation's items in order and the revision they were read at, for
    ``conversation_append_items``'s ``expected_revision``; ``NotFound`` for another owner's id."""
    check_conversation_id(conversation_id, param="conversation")
    # One transaction, the revision read first: under READ COMMITTED a concurrent append makes our
    # revision stale (a later 409) rather than hiding items behind a newer revision.
    with transaction.atomic():
        revision = (
            Conversation.objects.filter(id=conversation_id, owner=owner)
            .values_list("revision", flat=True)
            .first()
        )
        if revision is None:
            raise conversation_not_found(conversation_id)
        items = [
            entry.item
            for entry in ConversationItem.objects.filter(conversation_id=conversation_id)
            .select_related("item")
            .order_by("position")
        ]
    return items, revision
