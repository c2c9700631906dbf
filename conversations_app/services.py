"""Every write to conversations, one transaction each.

Positions are handed out from ``Conversation.next_position`` while the conversation row is locked
(``SELECT … FOR UPDATE`` or the optimistic ``UPDATE … WHERE revision = expected``), so two writers
never interleave inside one batch and never reuse a position; the unique (conversation, position)
index backs this up. Every change of the item list bumps ``revision``.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from conversations_app.models import Conversation, ConversationItem, Item
from conversations_app.schemas import NewItem
from conversations_app.selectors import (
    check_conversation_id,
    check_item_id,
    conversation_not_found,
    item_not_found,
)
from gateway.core import errors
from gateway.core.ids import new_id


def item_already_in_conversation(item_id: str) -> errors.BadRequest:
    # OpenAI's own wording (the id is not in it).
    return errors.BadRequest(
        "Item already in conversation",
        param="items",
        code="item_already_in_conversation",
    )


def _locked_conversation(*, id: str, owner: str) -> Conversation:
    check_conversation_id(id)
    conversation = Conversation.objects.select_for_update().filter(id=id, owner=owner).first()
    if conversation is None:
        raise conversation_not_found(id)
    return conversation


def _store_items(*, owner: str, conversation: Conversation, new_items: list[NewItem]) -> list[Item]:
    """Create, or look up, the items of one request: an id the owner already stored is referenced; the
    same id twice is stored once and listed twice (as OpenAI does); an id already in the conversation
    is refused, before anything is written."""
    ids = list(dict.fromkeys(new.id for new in new_items))
    in_conversation = set(
        ConversationItem.objects.filter(conversation=conversation, item_id__in=ids).values_list(
            "item_id", flat=True
        )
    )
    for new in new_items:
        if new.id in in_conversation:
            raise item_already_in_conversation(new.id)
    existing = {item.id: item for item in Item.objects.filter(id__in=ids)}
    result: list[Item] = []
    to_create: list[Item] = []
    for new in new_items:
        earlier = next((item for item in result if item.id == new.id), None)
        if earlier is not None:
            result.append(earlier)  # a second occurrence in this request
            continue
        stored = existing.get(new.id)
        if stored is not None and stored.owner != owner:
            stored = None
            if new.data is not None:
                # Ids are unguessable; one taken by another owner is refused without saying whose.
                raise errors.BadRequest(
                    f"Item with id '{new.id}' already exists.", param=new.param + ".id", code="invalid_value"
                )
        if new.data is None:
            if stored is None:
                raise item_not_found(new.id, param=new.param)
            result.append(stored)
        elif stored is not None:
            result.append(stored)
        else:
            item = Item(id=new.id, owner=owner, type=new.type, data=new.data)
            to_create.append(item)
            result.append(item)
    Item.objects.bulk_create(to_create)
    return result


def _attach(*, conversation: Conversation, items: list[Item], start: int) -> None:
    ConversationItem.objects.bulk_create(
        ConversationItem(conversation=conversation, item=item, position=start + offset)
        for offset, item in enumerate(items)
    )


@transaction.atomic
def conversation_create(
    *, owner: str, metadata: dict[str, str], items: list[NewItem]
) -> tuple[Conversation, list[Item]]:
    """A new conversation and its initial items, all or nothing."""
    conversation = Conversation.objects.create(
        id=new_id("conv"),
        owner=owner,
        metadata=metadata,
        revision=1 if items else 0,
        item_count=len(items),
        next_position=len(items),
    )
    stored = _store_items(owner=owner, conversation=conversation, new_items=items)
    _attach(conversation=conversation, items=stored, start=0)
    return conversation, stored


@transaction.atomic
def conversation_update(*, id: str, owner: str, metadata: dict[str, str]) -> Conversation:
    """Replace the metadata (OpenAI's update semantics: the object sent is the new metadata)."""
    conversation = _locked_conversation(id=id, owner=owner)
    conversation.metadata = metadata
    conversation.updated_at = timezone.now()
    conversation.save(update_fields=["metadata", "updated_at"])
    return conversation


@transaction.atomic
def conversation_delete(*, id: str, owner: str) -> None:
    """Delete the conversation and its ordering; the items stay (responses may reference them)."""
    conversation = _locked_conversation(id=id, owner=owner)
    ConversationItem.objects.filter(conversation=conversation).delete()
    conversation.delete()


@transaction.atomic
def conversation_items_create(*, id: str, owner: str, items: list[NewItem]) -> list[Item]:
    """Append a batch at the end, all or nothing."""
    conversation = _locked_conversation(id=id, owner=owner)
    stored = _store_items(owner=owner, conversation=conversation, new_items=items)
    start = conversation.next_position
    _attach(conversation=conversation, items=stored, start=start)
    Conversation.objects.filter(pk=conversation.pk).update(
        revision=F("revision") + 1,
        item_count=F("item_count") + len(stored),
        next_position=F("next_position") + len(stored),
        updated_at=timezone.now(),
    )
    return stored


@transaction.atomic
def conversation_item_delete(*, id: str, owner: str, item_id: str) -> Conversation:
    """Detach one item from the conversation; the stored item (and response history) stays."""
    conversation = _locked_conversation(id=id, owner=owner)
    check_item_id(item_id)
    deleted, _ = ConversationItem.objects.filter(conversation=conversation, item_id=item_id).delete()
    if not deleted:
        raise item_not_found(item_id)
    Conversation.objects.filter(pk=conversation.pk).update(
        revision=F("revision") + 1, item_count=F("item_count") - deleted, updated_at=timezone.now()
    )
    conversation.refresh_from_db()
    return conversation


def conversation_locked(conversation_id: str) -> errors.Conflict:
    return errors.Conflict(
        f"Conversation '{conversation_id}' was changed by another request while this one was "
        "running; its items were not appended. Retry with the conversation's current items.",
        param="conversation",
        code="conversation_locked",
    )


@transaction.atomic
def conversation_append_items(
    *, conversation_id: str, owner: str, item_ids: list[str], expected_revision: int
) -> int:
    """Append stored items if the conversation is still at ``expected_revision``; returns the new one.

    The check and the claim of positions are one ``UPDATE … WHERE revision = expected``: of two racing
    writers the second matches nothing and gets 409 ``conversation_locked``, never appending onto a
    history it did not see.
    """
    check_conversation_id(conversation_id, param="conversation")
    count = len(item_ids)
    updated = Conversation.objects.filter(id=conversation_id, owner=owner, revision=expected_revision).update(
        revision=F("revision") + 1,
        item_count=F("item_count") + count,
        next_position=F("next_position") + count,
        updated_at=timezone.now(),
    )
    if not updated:
        if Conversation.objects.filter(id=conversation_id, owner=owner).exists():
            raise conversation_locked(conversation_id)
        raise conversation_not_found(conversation_id)
    conversation = Conversation.objects.get(id=conversation_id)
    if len(set(item_ids)) != count:
        raise item_already_in_conversation(next(i for i in item_ids if item_ids.count(i) > 1))
    found = {item.id: item for item in Item.objects.filter(id__in=item_ids, owner=owner)}
    for item_id in item_ids:
        if item_id not in found:
            raise item_not_found(item_id)
    already = ConversationItem.objects.filter(conversation=conversation, item_id__in=item_ids).first()
    if already is not None:
        raise item_already_in_conversation(already.item_id)
    _attach(
        conversation=conversation,
        items=[found[item_id] for item_id in item_ids],
        start=conversation.next_position - count,
    )
    return expected_revision + 1
