"""Reads of conversations (minimal seam; the Conversations issue provides the real implementation)."""

from __future__ import annotations

from conversations_app.models import Item
from gateway import errors


def conversation_history(*, conversation_id: str, owner: str) -> tuple[list[Item], int]:
    """The conversation's items in order and its revision; unknown or another owner's → 404."""
    raise errors.NotFound(f"Conversation with id '{conversation_id}' not found.", param="conversation")
