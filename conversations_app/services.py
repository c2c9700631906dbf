"""Writes of conversations (minimal seam; the Conversations issue provides the real implementation)."""

from __future__ import annotations

from gateway import errors


def conversation_append_items(
    *, conversation_id: str, owner: str, item_ids: list[str], expected_revision: int
) -> int:
    """Append stored items to the conversation; a concurrent append → 409 ``conversation_locked``."""
    raise errors.NotFound(f"Conversation with id '{conversation_id}' not found.", param="conversation")
