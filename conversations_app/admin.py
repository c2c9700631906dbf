"""Admin for ops teams: find conversations, read them as transcripts, delete them.

Read-only; a delete goes through ``services.conversation_delete`` like the API, and items are never
changed or deleted here (checkpoints and conversations share them).
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html

from conversations_app import services
from conversations_app.models import Conversation, ConversationItem, Item

TRANSCRIPT_PAGE_SIZE = 200


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


def _part_text(part: Any) -> str:
    if not isinstance(part, dict):
        return str(part)
    kind = part.get("type")
    if kind in ("input_text", "output_text", "summary_text", "reasoning_text", "text"):
        return str(part.get("text", ""))
    if kind == "refusal":
        return f"[refusal] {part.get('refusal', '')}"
    if kind == "input_image":
        return f"[image {part.get('image_url') or part.get('file_id') or ''}]"
    if kind == "input_file":
        return f"[file {part.get('filename') or part.get('file_id') or part.get('file_url') or ''}]"
    return f"[{kind}]"


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_part_text(part) for part in content)
    return "" if content is None else pretty_json(content)


def transcript_entry(item: Item) -> dict[str, str]:
    """Who said what, for one item: a label (role or tool) and readable text."""
    data = item.data if isinstance(item.data, dict) else {}
    kind = data.get("type", item.type)
    if kind == "message":
        return {
            "label": str(data.get("role", "message")),
            "kind": "message",
            "text": _content_text(data.get("content")),
        }
    if kind in ("function_call", "custom_tool_call"):
        args = data.get("arguments", data.get("input", ""))
        return {
            "label": "tool call",
            "kind": "call",
            "text": f"{data.get('name', '?')}({args})  [call_id {data.get('call_id', '')}]",
        }
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {
            "label": "tool output",
            "kind": "output",
            "text": f"[call_id {data.get('call_id', '')}] {_content_text(data.get('output'))}",
        }
    if kind == "reasoning":
        summary = _content_text(data.get("summary")) or _content_text(data.get("content"))
        return {"label": "reasoning", "kind": "reasoning", "text": summary}
    return {"label": kind, "kind": "other", "text": ""}


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("id", "owner", "created_at", "updated_at", "item_count", "metadata_summary")
    list_filter = ("owner", "created_at")
    date_hierarchy = "created_at"
    search_fields = ("id", "owner", "metadata")
    readonly_fields = ("id", "owner", "created_at", "updated_at", "item_count", "revision", "metadata_json")
    fields = readonly_fields
    actions = ("delete_conversations",)
    list_per_page = 50
    show_full_result_count = False  # no COUNT(*) over a large table on every page view

    @admin.display(description="metadata")
    def metadata_summary(self, obj: Conversation) -> str:
        return ", ".join(f"{k}={v}" for k, v in (obj.metadata or {}).items())

    @admin.display(description="metadata")
    def metadata_json(self, obj: Conversation) -> str:
        return format_html("<pre>{}</pre>", pretty_json(obj.metadata or {}))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_actions(self, request: HttpRequest) -> Any:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # ours goes through the service
        return actions

    @admin.action(permissions=["delete"], description="Delete selected conversations (items are kept)")
    def delete_conversations(self, request: HttpRequest, queryset: QuerySet[Conversation]) -> None:
        deleted = 0
        for conversation in queryset:
            services.conversation_delete(id=conversation.id, owner=conversation.owner)
            deleted += 1
        self.message_user(request, f"Deleted {deleted} conversation(s).", messages.SUCCESS)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = dict(extra_context or {})
        context.update(self._transcript(request, object_id))
        return super().change_view(request, object_id, form_url, context)

    def _transcript(self, request: HttpRequest, conversation_id: str) -> dict[str, Any]:
        """One page of the transcript, by keyset on position (``?from=<position>``)."""
        try:
            start = int(request.GET.get("from", "0"))
        except ValueError:
            start = 0
        rows = list(
            ConversationItem.objects.filter(conversation_id=conversation_id, position__gte=start)
            .select_related("item")
            .order_by("position")[: TRANSCRIPT_PAGE_SIZE + 1]
        )
        entries = [
            {
                "position": row.position,
                "id": row.item_id,
                "type": row.item.type,
                "raw": pretty_json(row.item.data),
                **transcript_entry(row.item),
            }
            for row in rows[:TRANSCRIPT_PAGE_SIZE]
        ]
        next_from = rows[TRANSCRIPT_PAGE_SIZE].position if len(rows) > TRANSCRIPT_PAGE_SIZE else None
        return {"transcript": entries, "transcript_next": next_from, "transcript_from": start}


@admin.register(Item)
class ItemAdmin(admin.ModelAdmin):
    list_display = ("id", "type", "owner", "created_at")
    list_filter = ("type", "created_at")
    search_fields = ("id", "owner")
    readonly_fields = ("id", "owner", "type", "created_at", "data_json")
    fields = readonly_fields
    show_full_result_count = False

    @admin.display(description="data")
    def data_json(self, obj: Item) -> str:
        return format_html("<pre>{}</pre>", pretty_json(obj.data))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Items are immutable and shared: stored responses' checkpoints and conversations reference
        # them, and processes cache checkpoints. Deleting one would rewrite stored histories.
        return False
