"""Keep the in-process history cache (``responses_app.history_cache``) in step with this process's
deletes and edits made outside the API (the admin): a deleted response's entry goes, and an edited
or deleted item empties the cache (items are shared by many checkpoints). Continuations re-check the
parent's row on every request anyway, so a delete on another process is never bypassed.
"""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from conversations_app.models import Item
from responses_app.history_cache import history_cache
from responses_app.models import Response


@receiver(post_delete, sender=Response, dispatch_uid="responses_history_cache_response_delete")
def _response_deleted(sender: Any, instance: Response, **kwargs: Any) -> None:
    history_cache.discard(instance.id)


@receiver(post_delete, sender=Item, dispatch_uid="responses_history_cache_item_delete")
def _item_deleted(sender: Any, instance: Item, **kwargs: Any) -> None:
    history_cache.clear()


@receiver(post_save, sender=Item, dispatch_uid="responses_history_cache_item_save")
def _item_saved(sender: Any, instance: Item, created: bool, **kwargs: Any) -> None:
    if not created:  # a new item is in no stored checkpoint yet
        history_cache.clear()
