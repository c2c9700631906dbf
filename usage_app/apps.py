from django.apps import AppConfig


class UsageAppConfig(AppConfig):
    """The usage ledger (one row per model call), OpenAI's Usage API over it, and quotas."""

    name = "usage_app"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Usage"

    def ready(self) -> None:
        from gateway.core import lifecycle, pipeline
        from usage_app import quotas, writer

        # The rows still pending are written once the server's work in flight has ended (the drain).
        lifecycle.on_shutdown(writer.flush)
        pipeline.quota_gate = quotas.gate  # the kernel's quota rule (it imports no app)
