from django.apps import AppConfig


class InferenceAppConfig(AppConfig):
    name = "inference_app"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from gateway.core import lifecycle
        from gateway.core.config import get_config
        from inference_app.engine.embedded import EmbeddedUpstream
        from inference_app.upstream import queue_metrics
        from inference_app.upstream.http import close_upstreams, use_embedded_engine
        from inference_app.upstream.types import served_name
        from usage_app import metrics as usage_metrics

        # Without LLM_API_BASE or a broker, the gateway hosts the engine itself (when vLLM is here).
        use_embedded_engine(EmbeddedUpstream)
        config = get_config()
        if not config.http_upstreams:
            # The engine (in process or on the GPU workers) serves one known name: the metrics label
            # it before any model list is read.
            usage_metrics.models_listed([served_name(config)])
        queue_metrics.register(config)
        # The upstream's session on the server's loop closes with the server.
        lifecycle.on_shutdown(close_upstreams)
