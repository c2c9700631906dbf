from django.apps import AppConfig


class UsageAppConfig(AppConfig):
    """The usage ledger (one row per model call), OpenAI's Usage API over it, and quotas."""

    name = "usage_app"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Usage"
