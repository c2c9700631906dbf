from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"
    verbose_name = "Gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from gateway import fastroutes, lifecycle
        from gateway.config import get_config
        from gateway.messages import ROUTES as MESSAGES_ROUTES
        from gateway.passthrough import ROUTES as PASSTHROUGH_ROUTES
        from gateway.passthrough import extra_routes
        from inference_app.upstream import close_upstreams

        # The operator's [passthrough] extra_routes are read once, at start-up, like all config.
        extra = extra_routes(get_config().passthrough.extra_routes)
        for path, route in {**extra, **PASSTHROUGH_ROUTES, **MESSAGES_ROUTES}.items():
            fastroutes.relay(path, route)
        # The upstream's session on the server's loop closes with the server.
        lifecycle.on_shutdown(close_upstreams)
