from django.apps import AppConfig


class MessagesConfig(AppConfig):
    name = "messages_app"
    verbose_name = "Anthropic Messages"

    def ready(self) -> None:
        from gateway.core import fastroutes
        from messages_app.routes import ROUTES

        for path, route in ROUTES.items():
            fastroutes.relay(path, route)
