from django.apps import AppConfig


class PassthroughConfig(AppConfig):
    name = "passthrough_app"
    verbose_name = "Pass-through"

    def ready(self) -> None:
        from gateway.core import fastroutes
        from gateway.core.config import get_config
        from passthrough_app.routes import ROUTES, extra_routes

        # The operator's [passthrough] extra_routes are read once, at start-up, like all config.
        for path, route in {**extra_routes(get_config().passthrough.extra_routes), **ROUTES}.items():
            fastroutes.relay(path, route)
