from django.apps import AppConfig


class ProjectConfig(AppConfig):
    """The Django project as an app: its management commands, admin templates and template tags."""

    name = "gateway"
    label = "gateway_project"
    verbose_name = "Gateway project"
