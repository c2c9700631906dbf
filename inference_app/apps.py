from django.apps import AppConfig


class InferenceAppConfig(AppConfig):
    name = "inference_app"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from gateway.core import lifecycle
        from inference_app.engine.embedded import EmbeddedUpstream
        from inference_app.upstream.http import close_upstreams, use_embedded_engine

        # Without LLM_API_BASE or a broker, the gateway hosts the engine itself (when vLLM is here).
        use_embedded_engine(EmbeddedUpstream)
        # The upstream's session on the server's loop closes with the server.
        lifecycle.on_shutdown(close_upstreams)
