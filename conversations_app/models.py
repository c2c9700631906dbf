"""Items (stored once, shared by responses and conversations) and conversations."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Item(models.Model):
    """One Responses item, stored once under our public id; checkpoints and conversations hold ordered
    references to it, so continuing a chain never copies history."""

    id = models.CharField(primary_key=True, max_length=128)
    owner = models.CharField(max_length=512)  # read by id and owner: the primary key serves it
    type = models.CharField(max_length=64)
    data = models.JSONField(help_text="The item exactly as the API returns it.")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"{self.type} {self.id}"


class Conversation(models.Model):
    """An ordered list of references to items, owned by one principal.

    ``revision`` counts every change of the list, for optimistic locking
    (``services.conversation_append_items``); ``item_count`` and ``next_position`` are kept by the
    same writes, so nothing ever counts or scans the items. ``updated_at`` moves with every change
    (metadata or items): retention ages a conversation by it (docs/operations.md, "Retention").
    """

    id = models.CharField(primary_key=True, max_length=128)
    owner = models.CharField(max_length=512)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(default=timezone.now)
    revision = models.BigIntegerField(default=0)
    item_count = models.IntegerField(default=0)
    next_position = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # Every API read filters by (id, owner); the admin lists by owner and date.
            models.Index(fields=["owner", "-created_at"], name="conv_owner_created_idx"),
            models.Index(fields=["-created_at"], name="conv_created_idx"),
            models.Index(fields=["updated_at"], name="conv_updated_idx"),  # the retention purge
        ]

    def __str__(self) -> str:
        return self.id


class ConversationItem(models.Model):
    """The item at ``position`` in a conversation. Detaching an item deletes only this row."""

    conversation = models.ForeignKey(
        Conversation,
        on_delete=models.CASCADE,
        related_name="entries",
        db_index=False,  # the (conversation, position) unique index leads with it
    )
    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="conversation_entries")
    position = models.BigIntegerField()
    added_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["conversation_id", "position"]  # the column, not a join to the conversation
        constraints = [
            # Keyset pagination walks this index; it also makes a lost or interleaved append
            # that reused a position fail loudly instead of corrupting the order.
            models.UniqueConstraint(fields=["conversation", "position"], name="conv_item_position_uniq"),
        ]
        indexes = [
            # Resolves `after` and membership. Not unique: one request may list an item twice (each
            # occurrence is its own entry); re-adding an item already there is refused by the service.
            models.Index(fields=["conversation", "item"], name="conv_item_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.conversation_id}[{self.position}] {self.item_id}"
