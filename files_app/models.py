"""Files, vector stores, their attachments and the searchable chunks (docs/file-search.md).

Bytes live in Django's storage (``File.storage_name``); everything searchable lives in the database
(chunks, attributes, embeddings), so every gateway replica sees the same store. Counts and statuses
the API reports (``file_counts``, ``usage_bytes``, a store's ``status``) are read from the
``VectorStoreFile`` rows when answered, never kept as counters, so they are true at every moment.
"""

from __future__ import annotations

from django.db import models


class File(models.Model):
    """One uploaded file (``file-…``). Its row is committed only once its bytes are stored."""

    id = models.CharField(primary_key=True, max_length=64)
    owner = models.CharField(max_length=512)
    filename = models.CharField(max_length=1024)
    purpose = models.CharField(max_length=32)
    bytes = models.BigIntegerField()
    content_type = models.CharField(max_length=255, blank=True, default="")
    storage_name = models.CharField(max_length=1024, help_text="The name in Django's file storage.")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["owner", "-created_at"], name="file_owner_created_idx"),
            # The sweep's expired files (only files with an expiry are in it).
            models.Index(
                fields=["expires_at"], name="file_expires_idx", condition=models.Q(expires_at__isnull=False)
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.filename}"


class VectorStore(models.Model):
    """A searchable collection of files (``vs_…``).

    ``embedding_model`` / ``embedding_dimensions`` record the embedding space its chunks were built
    in ("" / None: keyword only). ``revision`` grows with every change of its published chunks, so a
    replica's in-memory search index knows when it is stale."""

    id = models.CharField(primary_key=True, max_length=64)
    owner = models.CharField(max_length=512)
    name = models.CharField(max_length=512, blank=True, default="")
    description = models.CharField(max_length=512, blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_active_at = models.DateTimeField(auto_now_add=True)
    expires_after = models.JSONField(null=True, blank=True)  # {"anchor": "last_active_at", "days": N}
    expires_at = models.DateTimeField(null=True, blank=True)
    embedding_model = models.CharField(max_length=256, blank=True, default="")
    embedding_dimensions = models.IntegerField(null=True, blank=True)
    revision = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["owner", "-created_at"], name="vs_owner_created_idx")]

    def __str__(self) -> str:
        return f"{self.id} {self.name}"


class VectorStoreFileBatch(models.Model):
    """A batch of files attached together (``vsfb_…``); its counts are read from its files."""

    class Status(models.TextChoices):
        IN_PROGRESS = "in_progress"
        COMPLETED = "completed"
        CANCELLED = "cancelled"
        FAILED = "failed"

    id = models.CharField(primary_key=True, max_length=64)
    vector_store = models.ForeignKey(VectorStore, on_delete=models.CASCADE, related_name="batches")
    created_at = models.DateTimeField(auto_now_add=True)
    cancelled = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.id


class VectorStoreFile(models.Model):
    """A file attached to a store, and the state of its ingestion.

    ``lease_expires_at`` is held (and renewed) by the worker ingesting it: the sweep fails an
    ``in_progress`` attachment whose lease ran out (a killed worker), so none stays in progress forever.
    Its chunks are published in the same transaction that makes it ``completed``."""

    class Status(models.TextChoices):
        IN_PROGRESS = "in_progress"
        COMPLETED = "completed"
        CANCELLED = "cancelled"
        FAILED = "failed"

    vector_store = models.ForeignKey(
        VectorStore, on_delete=models.CASCADE, related_name="files", db_index=False
    )  # the unique (vector_store, file) index leads with it
    file = models.ForeignKey(File, on_delete=models.CASCADE, related_name="attachments")
    batch = models.ForeignKey(
        VectorStoreFileBatch, on_delete=models.SET_NULL, null=True, blank=True, related_name="files"
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.IN_PROGRESS)
    last_error = models.JSONField(null=True, blank=True)  # {"code": ..., "message": ...}
    attributes = models.JSONField(default=dict, blank=True)
    chunking_strategy = models.JSONField(default=dict, blank=True)
    usage_bytes = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    lease_owner = models.CharField(max_length=128, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["vector_store", "file"], name="vsfile_store_file_uniq"),
        ]
        indexes = [
            models.Index(fields=["status", "lease_expires_at"], name="vsfile_status_lease_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.vector_store_id}/{self.file_id} {self.status}"


class Chunk(models.Model):
    """One searchable piece of a file in one store: its text (cut from the source text), token
    count, and embedding (float32 little-endian bytes; None in a keyword-only store)."""

    store_file = models.ForeignKey(VectorStoreFile, on_delete=models.CASCADE, related_name="chunks")
    vector_store = models.ForeignKey(
        VectorStore, on_delete=models.CASCADE, related_name="chunks", db_index=False
    )
    file_id = models.CharField(max_length=64)
    position = models.IntegerField()
    text = models.TextField()
    tokens = models.IntegerField()
    embedding = models.BinaryField(null=True, blank=True)

    class Meta:
        ordering = ["store_file_id", "position"]
        indexes = [models.Index(fields=["vector_store", "store_file"], name="chunk_store_idx")]

    def __str__(self) -> str:
        return f"{self.file_id}#{self.position}"
