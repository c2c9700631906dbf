from django.apps import AppConfig


class ResponsesAppConfig(AppConfig):
    name = "responses_app"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from gateway import lifecycle
        from responses_app.tasks import sweep_forever

        lifecycle.on_startup(sweep_forever)  # the lease sweep, in every server process
