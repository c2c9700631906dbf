from django.apps import AppConfig


class ResponsesAppConfig(AppConfig):
    name = "responses_app"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from responses_app import signals  # noqa: F401  (connects the history-cache receivers)
