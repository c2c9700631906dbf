"""Stored responses: the terminal snapshot, status, usage and the ordered checkpoint of items.

Items live once in ``conversations_app.Item``; ``history_item_ids`` lists what a successor continues
from, so a continuation reads one row and one batch of items, never the chain.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Response(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        IN_PROGRESS = "in_progress"
        COMPLETED = "completed"
        INCOMPLETE = "incomplete"
        FAILED = "failed"
        CANCELLED = "cancelled"

    id = models.CharField(primary_key=True, max_length=128)
    owner = models.CharField(max_length=512)
    status = models.CharField(max_length=16, choices=Status.choices)
    model = models.CharField(max_length=256)
    background = models.BooleanField(default=False)
    previous_response = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_constraint=False,
        db_index=False,  # Meta.indexes: a plain one (db_index adds a LIKE index on PostgreSQL)
    )
    conversation_id = models.CharField(max_length=128, blank=True, default="")
    request = models.JSONField(
        default=dict, help_text="The create request, request-scoped credentials stripped."
    )
    snapshot = models.JSONField(
        null=True, blank=True, help_text="The response object as GET returns it (null: history only)."
    )
    usage = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    agent_tree = models.JSONField(
        null=True,
        blank=True,
        help_text="Multi-agent responses: the versioned agent tree snapshot a continuation restores.",
    )
    history_item_ids = models.JSONField(
        default=list, help_text="Ordered ids of every item a continuation starts from (the checkpoint)."
    )
    input_item_count = models.PositiveIntegerField(
        default=0, help_text="history_item_ids[:input_item_count] are this response's input items."
    )
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    # The lease of the process running a background response (docs/operations.md): who runs it
    # ("host/pid/token") and until when; a runner renews it, the sweep fails a row whose lease expired.
    lease_owner = models.CharField(max_length=256, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # The lineage its model rounds belong to (inference_app.upstream.lineage): a continuation's
    # rounds carry its parent's, so placement finds the worker holding the chain's prefix.
    lineage = models.CharField(max_length=32, null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        # Only the indexes a query needs (docs/operations.md → Indexes): every stored response writes each.
        indexes = [
            models.Index(fields=["previous_response"], name="response_previous_idx"),
            models.Index(
                fields=["lease_expires_at"],
                name="response_unfinished_lease_idx",
                condition=models.Q(status__in=["queued", "in_progress"]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status not in (self.Status.QUEUED, self.Status.IN_PROGRESS)


class ResponseEvent(models.Model):
    """One stream event of a background response, kept for polling and ``starting_after`` replay."""

    response = models.ForeignKey(Response, on_delete=models.CASCADE, related_name="events")
    sequence_number = models.PositiveIntegerField()
    data = models.TextField(help_text="The event exactly as it was sent (JSON).")

    class Meta:
        ordering = ["response", "sequence_number"]
        constraints = [
            models.UniqueConstraint(fields=["response", "sequence_number"], name="response_event_seq_unique")
        ]

    def __str__(self) -> str:
        return f"{self.response_id}#{self.sequence_number}"
