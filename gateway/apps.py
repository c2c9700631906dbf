from django.apps import AppConfig


class ProjectConfig(AppConfig):
    """The Django project as an app: its management commands, admin templates and template tags."""

    name = "gateway"
    label = "gateway_project"
    verbose_name = "Gateway project"

    def ready(self) -> None:
        from gateway.core import lifecycle
        from gateway.data.retention import purge_forever

        lifecycle.on_startup(purge_forever)  # the retention timer of a gateway without a broker
