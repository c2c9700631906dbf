"""The usage ledger: one row per model call that reached an upstream (docs/operations.md)."""

from __future__ import annotations

from django.db import models


class UsageRecord(models.Model):
    """One model call: who, which route and model, the tokens the upstream reported, how it ended.

    Token counts are ``None`` when the upstream reported none (the call still counts as a request)."""

    class Kind(models.TextChoices):
        COMPLETIONS = "completions"  # chat/completions, completions, Responses rounds, Messages
        EMBEDDINGS = "embeddings"
        OTHER = "other"  # count_tokens, audio, vLLM's own routes

    created_at = models.DateTimeField(help_text="When the call started.")
    owner = models.CharField(max_length=512, help_text="The principal's owner key.")
    api_key_id = models.BigIntegerField(null=True, blank=True)
    route = models.CharField(max_length=128)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    model = models.CharField(max_length=256, blank=True, default="")
    response_id = models.CharField(max_length=128, blank=True, default="")
    request_id = models.CharField(max_length=128, blank=True, default="")
    input_tokens = models.BigIntegerField(null=True, blank=True)
    output_tokens = models.BigIntegerField(null=True, blank=True)
    cached_tokens = models.BigIntegerField(null=True, blank=True)
    reasoning_tokens = models.BigIntegerField(null=True, blank=True)
    status = models.PositiveSmallIntegerField(help_text="The upstream's HTTP status (499: the client left).")
    latency_ms = models.PositiveIntegerField()

    class Meta:
        indexes = [
            models.Index(fields=["created_at"], name="usage_created"),
            models.Index(fields=["owner", "created_at"], name="usage_owner_created"),
        ]
        verbose_name = "usage record"

    def __str__(self) -> str:
        return f"{self.route} {self.model} ({self.owner})"


class QuotaState(models.Model):
    """One principal's quota windows in the database store (``usage_app.quotas``, used when no
    ``REDIS_URL`` is set): every admission reads and writes this row in one locking transaction.

    ``requests``: ``[second (epoch ms), admissions]`` pairs of the last minute, oldest first; ``slots``:
    concurrency slot id -> expiry (epoch ms); token counters of the current minute and UTC day."""

    owner = models.CharField(max_length=512, primary_key=True)
    requests = models.JSONField(default=list)
    slots = models.JSONField(default=dict)
    minute = models.BigIntegerField(default=0)
    minute_tokens = models.BigIntegerField(default=0)
    day = models.BigIntegerField(default=0)
    day_tokens = models.BigIntegerField(default=0)

    class Meta:
        verbose_name = "quota state"

    def __str__(self) -> str:
        return self.owner
