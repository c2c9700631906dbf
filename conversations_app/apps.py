from django.apps import AppConfig


class ConversationsAppConfig(AppConfig):
    name = "conversations_app"
    default_auto_field = "django.db.models.BigAutoField"
