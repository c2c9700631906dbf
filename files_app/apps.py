from django.apps import AppConfig


class FilesAppConfig(AppConfig):
    """OpenAI's Files and vector stores APIs, background ingestion and retrieval (docs/file-search.md)."""

    name = "files_app"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Files and vector stores"
