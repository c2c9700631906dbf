from django.apps import AppConfig


class ResponsesAppConfig(AppConfig):
    name = "responses_app"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from gateway.core import fastroutes, lifecycle
        from responses_app.api.fastpath import serve_create
        from responses_app.tasks import sweep_forever

        fastroutes.handle("/v1/responses", serve_create)  # served below Django (gateway.core.fastroutes)
        lifecycle.on_startup(sweep_forever)  # the lease sweep, in every server process
