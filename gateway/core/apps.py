from django.apps import AppConfig


class CoreConfig(AppConfig):
    """The kernel: API keys (the one model) and the rules every app shares. Its label stays "gateway",
    the app that held the model before the kernel had a package of its own (migration history)."""

    name = "gateway.core"
    label = "gateway"
    verbose_name = "Gateway"
    default_auto_field = "django.db.models.BigAutoField"
