from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"
    verbose_name = "Gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from gateway import fastroutes
        from gateway.config import get_config
        from gateway.messages import ROUTES as MESSAGES_ROUTES
        from gateway.passthrough import ROUTES as PASSTHROUGH_ROUTES
        from gateway.passthrough import extra_routes

        # The operator's [passthrough] extra_routes are read once, at start-up, like all config.
        extra = extra_routes(get_config().passthrough.extra_routes)
        for path, route in {**extra, **PASSTHROUGH_ROUTES, **MESSAGES_ROUTES}.items():
            fastroutes.relay(path, route)
