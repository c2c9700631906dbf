"""Admin: stored responses with their items; payloads read-only and pretty-printed.

Deleting goes through ``services.response_delete`` like the API (one delete, the cached checkpoint
dropped with it); there is no second path that changes stored responses.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from conversations_app.models import Item
from responses_app.models import Response, ResponseEvent
from responses_app.storage import services


def _pretty(value: Any) -> str:
    return format_html(
        "<pre style='white-space: pre-wrap'>{}</pre>", json.dumps(value, indent=2, ensure_ascii=False)
    )


class ResponseEventInline(admin.TabularInline):
    model = ResponseEvent
    extra = 0
    can_delete = False
    fields = ("sequence_number", "data")
    readonly_fields = fields
    show_change_link = False


@admin.register(Response)
class ResponseAdmin(admin.ModelAdmin):
    list_display = ("id", "status", "model", "owner", "background", "total_tokens", "created_at")
    list_filter = ("status", "model", "owner", "background")
    search_fields = ("id", "previous_response__id", "conversation_id")
    ordering = ("-created_at",)
    date_hierarchy = "created_at"
    fields = (
        "id",
        "owner",
        "status",
        "model",
        "background",
        "previous_response",
        "conversation_id",
        "created_at",
        "completed_at",
        "usage_pretty",
        "error_pretty",
        "items_pretty",
        "request_pretty",
        "snapshot_pretty",
    )
    readonly_fields = fields
    inlines = (ResponseEventInline,)

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def delete_model(self, request: HttpRequest, obj: Response) -> None:
        services.response_delete(id=obj.id, owner=obj.owner)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Response]) -> None:
        for response_id, owner in queryset.values_list("id", "owner"):
            services.response_delete(id=response_id, owner=owner)

    @admin.display(description="total tokens")
    def total_tokens(self, obj: Response) -> Any:
        return (obj.usage or {}).get("total_tokens")

    @admin.display(description="usage")
    def usage_pretty(self, obj: Response) -> str:
        return _pretty(obj.usage)

    @admin.display(description="error")
    def error_pretty(self, obj: Response) -> str:
        return _pretty(obj.error)

    @admin.display(description="request")
    def request_pretty(self, obj: Response) -> str:
        return _pretty(obj.request)

    @admin.display(description="snapshot")
    def snapshot_pretty(self, obj: Response) -> str:
        return _pretty(obj.snapshot)

    @admin.display(description="items (checkpoint, in order)")
    def items_pretty(self, obj: Response) -> str:
        by_id = {i.id: i.data for i in Item.objects.filter(id__in=obj.history_item_ids, owner=obj.owner)}
        return _pretty([by_id.get(i, {"id": i, "missing": True}) for i in obj.history_item_ids])
