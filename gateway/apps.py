from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"
    verbose_name = "Gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from gateway import fastroutes
        from gateway.messages import ROUTES as MESSAGES_ROUTES
        from gateway.passthrough import ROUTES as PASSTHROUGH_ROUTES

        for path, route in {**PASSTHROUGH_ROUTES, **MESSAGES_ROUTES}.items():
            fastroutes.relay(path, route)
