"""Gateway-level models: inbound API keys."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models

from gateway.core.principal import LIMIT_FIELDS

__all__ = ["LIMIT_FIELDS", "LIMIT_RULE", "ApiKey"]
LIMIT_RULE = "must be a positive whole number; leave it empty for the [quotas] default"


class ApiKey(models.Model):
    """A named inbound API key; only a SHA-256 digest of its 256-bit random secret is stored (no KDF
    needed for a secret that cannot be guessed)."""

    name = models.CharField(max_length=100, unique=True)
    prefix = models.CharField(
        max_length=32, db_index=True, help_text="The secret's first characters, to recognise it."
    )
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    is_active = models.BooleanField(default=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    is_admin = models.BooleanField(
        default=False, help_text="Sees every principal's usage (GET /v1/organization/usage/…)."
    )
    # Quota overrides for this key ([quotas] holds everyone's defaults); empty: the default.
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveBigIntegerField(null=True, blank=True)
    tokens_per_day = models.PositiveBigIntegerField(null=True, blank=True)
    max_concurrent = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Concurrent requests (a background response holds one until it ends).",
    )

    class Meta:
        ordering = ["name"]
        verbose_name = "API key"
        verbose_name_plural = "API keys"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def clean(self) -> None:
        """Quota overrides are positive integers or empty (the admin form and ``apikey_update``)."""
        wrong = {
            name: f"{name.replace('_', ' ').capitalize()} {LIMIT_RULE}."
            for name in LIMIT_FIELDS
            if (value := getattr(self, name)) is not None
            and (isinstance(value, bool) or not isinstance(value, int) or value < 1)
        }
        if wrong:
            raise ValidationError(wrong)

    @property
    def owner(self) -> str:
        """The owner key recorded on objects this key creates."""
        return f"key:{self.pk}"
