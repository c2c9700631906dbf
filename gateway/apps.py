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
        from gateway.relay.http_client import HttpPool
        from inference_app.upstream import use_http_client

        # The operator's [passthrough] extra_routes are read once, at start-up, like all config.
        extra = extra_routes(get_config().passthrough.extra_routes)
        for path, route in {**extra, **PASSTHROUGH_ROUTES, **MESSAGES_ROUTES}.items():
            fastroutes.relay(path, route)
        # HttpUpstream's client: the relay package's lean one (public APIs only, so it serves with
        # the relay switched off too); inference_app may not import gateway.relay itself.
        use_http_client(HttpPool)
