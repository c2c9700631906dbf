"""Admin for ops teams: files and vector stores with their status and chunk counts; delete them.

Read-only. Deleting a file goes through ``services.file_remove`` like the API (its attachments and
chunks in every store go with it, and its bytes leave the storage once the deletion commits);
deleting a vector store keeps its files.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.db import transaction
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html

from files_app import services
from files_app.models import Chunk, File, VectorStore, VectorStoreFile, VectorStoreFileBatch


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def _count(rows: QuerySet[Any], link: str) -> Coalesce:
    """``COUNT(*)`` of ``rows`` per parent row (a subquery, so two counts never multiply)."""
    counted = (
        rows.filter(**{link: OuterRef("pk")}).order_by().values(link).annotate(n=Count("pk")).values("n")
    )
    return Coalesce(Subquery(counted, output_field=IntegerField()), 0)


class ReadOnly(admin.ModelAdmin):  # type: ignore[type-arg]
    show_full_result_count = False  # no COUNT(*) over a large table on every page view
    list_per_page = 50

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(File)
class FileAdmin(ReadOnly):
    list_display = ("id", "filename", "owner", "purpose", "bytes", "stores", "created_at", "expires_at")
    list_filter = ("purpose", "created_at")
    date_hierarchy = "created_at"
    search_fields = ("id", "filename", "owner")
    readonly_fields = (
        "id",
        "owner",
        "filename",
        "purpose",
        "bytes",
        "content_type",
        "storage_name",
        "created_at",
        "expires_at",
    )
    fields = readonly_fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[File]:
        return (
            super().get_queryset(request).annotate(store_count=_count(VectorStoreFile.objects.all(), "file"))
        )

    @admin.display(description="stores", ordering="store_count")
    def stores(self, obj: Any) -> int:
        return int(obj.store_count)

    def delete_model(self, request: HttpRequest, obj: File) -> None:
        with transaction.atomic():
            services.file_remove(obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[File]) -> None:
        with transaction.atomic():
            for found in queryset:
                services.file_remove(found)


class VectorStoreFileInline(admin.TabularInline):  # type: ignore[type-arg]
    model = VectorStoreFile
    fields = ("file", "status", "chunk_count", "usage_bytes", "last_error", "attributes", "created_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[VectorStoreFile]:
        return (
            super()
            .get_queryset(request)
            .select_related("file")
            .annotate(n_chunks=_count(Chunk.objects.all(), "store_file"))
        )

    @admin.display(description="chunks")
    def chunk_count(self, obj: Any) -> int:
        return int(obj.n_chunks)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(VectorStore)
class VectorStoreAdmin(ReadOnly):
    list_display = (
        "id",
        "name",
        "owner",
        "status",
        "files_total",
        "files_in_progress",
        "files_failed",
        "chunks",
        "usage",
        "embedding_model",
        "created_at",
    )
    list_filter = ("embedding_model", "created_at")
    date_hierarchy = "created_at"
    search_fields = ("id", "name", "owner")
    readonly_fields = (
        "id",
        "owner",
        "name",
        "description",
        "status",
        "metadata_json",
        "created_at",
        "last_active_at",
        "expires_after",
        "expires_at",
        "embedding_model",
        "embedding_dimensions",
        "revision",
    )
    fields = readonly_fields
    inlines = (VectorStoreFileInline,)

    def get_queryset(self, request: HttpRequest) -> QuerySet[VectorStore]:
        attachments = VectorStoreFile.objects.all()
        used = (
            attachments.filter(vector_store=OuterRef("pk"))
            .order_by()
            .values("vector_store")
            .annotate(n=Sum("usage_bytes"))
            .values("n")
        )
        return (
            super()
            .get_queryset(request)
            .annotate(
                n_files=_count(attachments, "vector_store"),
                n_in_progress=_count(attachments.filter(status="in_progress"), "vector_store"),
                n_failed=_count(attachments.filter(status="failed"), "vector_store"),
                n_chunks=_count(Chunk.objects.all(), "vector_store"),
                n_usage=Coalesce(Subquery(used, output_field=IntegerField()), 0),
            )
        )

    @admin.display(description="status")
    def status(self, obj: Any) -> str:
        if obj.expires_at is not None and obj.expires_at <= timezone.now():
            return "expired"
        return "in_progress" if obj.n_in_progress else "completed"

    @admin.display(description="files", ordering="n_files")
    def files_total(self, obj: Any) -> int:
        return int(obj.n_files)

    @admin.display(description="in progress", ordering="n_in_progress")
    def files_in_progress(self, obj: Any) -> int:
        return int(obj.n_in_progress)

    @admin.display(description="failed", ordering="n_failed")
    def files_failed(self, obj: Any) -> int:
        return int(obj.n_failed)

    @admin.display(description="chunks", ordering="n_chunks")
    def chunks(self, obj: Any) -> int:
        return int(obj.n_chunks)

    @admin.display(description="usage bytes", ordering="n_usage")
    def usage(self, obj: Any) -> int:
        return int(obj.n_usage)

    @admin.display(description="metadata")
    def metadata_json(self, obj: VectorStore) -> str:
        return format_html("<pre>{}</pre>", pretty_json(obj.metadata or {}))


@admin.register(VectorStoreFileBatch)
class VectorStoreFileBatchAdmin(ReadOnly):
    list_display = ("id", "vector_store", "cancelled", "files", "created_at")
    search_fields = ("id", "vector_store__id")
    readonly_fields = ("id", "vector_store", "cancelled", "created_at")
    fields = readonly_fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[VectorStoreFileBatch]:
        return super().get_queryset(request).annotate(n_files=_count(VectorStoreFile.objects.all(), "batch"))

    @admin.display(description="files", ordering="n_files")
    def files(self, obj: Any) -> int:
        return int(obj.n_files)
