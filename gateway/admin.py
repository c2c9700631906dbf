"""Admin: inbound API keys, and the login page's single sign-on link."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from gateway.core.auth import apikeys
from gateway.core.models import LIMIT_FIELDS, LIMIT_RULE, ApiKey
from gateway.data import principal
from usage_app import schemas

# The login page keeps username/password and adds "Log in with SSO" when it is configured.
admin.site.login_template = "admin/gateway_login.html"


class ApiKeyAddForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = ApiKey
        fields = ["name"]


class ApiKeyChangeForm(forms.ModelForm):  # type: ignore[type-arg]
    """A key's flags and quota overrides; a negative or zero limit is refused with the rule
    (``ApiKey.clean`` says it for zero)."""

    class Meta:
        model = ApiKey
        fields = ["name", "is_active", "is_admin", *LIMIT_FIELDS]
        error_messages = {
            name: {"min_value": f"{name.replace('_', ' ').capitalize()} {LIMIT_RULE}."}
            for name in LIMIT_FIELDS
        }


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = [
        "name",
        "prefix",
        "is_active",
        "is_admin",
        *LIMIT_FIELDS,
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["is_active", "is_admin"]
    search_fields = ["name", "prefix"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at", "owner", "usage_id"]
    actions = ["revoke", "delete_principal_data"]

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        kwargs["form"] = ApiKeyAddForm if obj is None else ApiKeyChangeForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ["name"]
        return [
            "name",
            "prefix",
            "is_active",
            "owner",
            "usage_id",
            "is_admin",
            *LIMIT_FIELDS,
            "created_at",
            "last_used_at",
            "revoked_at",
        ]

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            if not obj.is_active and obj.revoked_at is None:
                obj.revoked_at = timezone.now()
            super().save_model(request, obj, form, change)
            apikeys.reset()
            return
        secret = apikeys.generate_secret()
        obj.prefix = apikeys.display_prefix(secret)
        obj.key_hash = apikeys.hash_secret(secret)
        super().save_model(request, obj, form, change)
        apikeys.reset()
        messages.warning(
            request,
            f"API key {obj.name!r} created: {secret} — copy it now, it will not be shown again.",
        )

    def delete_model(self, request: HttpRequest, obj: ApiKey) -> None:
        super().delete_model(request, obj)
        apikeys.reset()

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        super().delete_queryset(request, queryset)
        apikeys.reset()

    @admin.display(description="usage API id")
    def usage_id(self, obj: ApiKey) -> str:
        """How the Usage API names the key (``api_key_id``, ``api_key_ids``)."""
        return schemas.api_key_public_id(obj.pk) or ""

    @admin.action(description="Revoke selected API keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = queryset.filter(is_active=True).update(is_active=False, revoked_at=timezone.now())
        apikeys.reset()
        self.message_user(request, f"{count} API key(s) revoked.")

    @admin.action(
        description="Delete all data stored for the selected keys' principals (the keys stay)",
        permissions=["delete"],
    )
    def delete_principal_data(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        """What ``manage.py delete_principal key:<id>`` does, for each selected key."""
        for key in queryset:
            done = principal.delete(key.owner)
            summary = ", ".join(f"{count} {kind}" for kind, count in done.as_dict().items())
            self.message_user(request, f"Deleted the data of {key.owner} ({key.name}): {summary}.")
