from django.apps import AppConfig


class ResponsesAppConfig(AppConfig):
    name = "responses_app"
    default_auto_field = "django.db.models.BigAutoField"
