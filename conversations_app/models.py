"""Items (stored once, shared by responses and conversations) and conversations."""

from __future__ import annotations

from django.db import models


class Item(models.Model):
    """One Responses item (message, function_call, function_call_output, reasoning, …).

    Stored once with our public id; a response's checkpoint and a conversation each hold ordered
    references to items, so continuing a chain never copies or walks history.
    """

    id = models.CharField(primary_key=True, max_length=128)
    owner = models.CharField(max_length=512, db_index=True)
    type = models.CharField(max_length=64)
    data = models.JSONField(help_text="The item exactly as the API returns it.")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"{self.type} {self.id}"
