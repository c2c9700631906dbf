from django.apps import AppConfig


class InferenceAppConfig(AppConfig):
    name = "inference_app"
    default_auto_field = "django.db.models.BigAutoField"
