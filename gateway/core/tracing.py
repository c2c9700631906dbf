"""OpenTelemetry tracing: set up once per process from the standard ``OTEL_*`` variables.

On only when an exporter is configured (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_TRACES_EXPORTER``): then a ``TracerProvider`` with a
``BatchSpanProcessor`` and the OTLP/HTTP exporter is installed, and the maintained instrumentations
make the spans we do not make ourselves: the HTTP server span (ASGI, fast path included), the aiohttp
client (every upstream request carries a ``traceparent``), Celery (tasks continue the trace on the
worker) and the database driver (psycopg, sqlite3). Off, nothing is installed, the app is not wrapped
and the API's no-op tracer makes no span. ``docs/operations.md``, "Tracing".
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from gateway.core.config import Config, ConfigError, otel_environ

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

log = logging.getLogger("gateway.tracing")

OTLP_HTTP_DEFAULT = "http://localhost:4318/v1/traces"
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
# Request headers that may be recorded (OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_*) only redacted.
SANITIZED_HEADERS = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "api-key",
    "openai-api-key",
    ".*token.*",
    ".*secret.*",
    ".*key.*",
    ".*password.*",
    ".*session.*",
]
# An id in a path (``resp_…``, ``conv_…``, a UUID): templated out of span names (bounded names).
_ID_SEGMENT = re.compile(r"/(?:[a-z]+_[A-Za-z0-9]{6,}|[0-9a-fA-F-]{16,}|[A-Za-z0-9._~-]{33,})(?=/|$)")
TRACER_NAME = "gateway"


@dataclass(frozen=True)
class TracingSettings:
    """What the ``OTEL_*`` variables ask for; ``None`` from :func:`settings_from` means off."""

    exporters: tuple[str, ...]  # "otlp", "console"
    endpoint: str  # the OTLP/HTTP traces URL
    sampler: str
    sampler_arg: float | None
    resource: dict[str, str]


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def settings_from(otel: Mapping[str, str], *, service_name: str) -> TracingSettings | None:
    """Read ``otel`` (the ``OTEL_*`` variables); ``None``: tracing is off. Settings the gateway cannot
    honour (gRPC without its exporter, an unknown sampler) raise :class:`ConfigError`."""
    if _flag(otel.get("OTEL_SDK_DISABLED")):
        return None
    named = [name.strip().lower() for name in otel.get("OTEL_TRACES_EXPORTER", "").split(",") if name.strip()]
    endpoint = otel.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    base = otel.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if not endpoint and base:
        endpoint = base.rstrip("/") + "/v1/traces"  # the spec's per-signal path under a base URL
    if "none" in named or (not named and not endpoint):
        return None
    exporters = tuple(named) or ("otlp",)
    for name in exporters:
        if name not in ("otlp", "console"):
            raise ConfigError(
                f"OTEL_TRACES_EXPORTER: unsupported exporter {name!r} (use otlp, console or none)"
            )
    if "otlp" in exporters:
        protocol = (
            otel.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or otel.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
        ).strip() or "http/protobuf"
        if protocol == "grpc":
            raise ConfigError(
                "OTEL_EXPORTER_OTLP_PROTOCOL: grpc is not supported by this gateway (the gRPC exporter is "
                "not installed); use http/protobuf and the collector's OTLP/HTTP port (4318)"
            )
        if protocol != "http/protobuf":
            raise ConfigError(
                f"OTEL_EXPORTER_OTLP_PROTOCOL: unsupported protocol {protocol!r} (use http/protobuf)"
            )
    sampler = (otel.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on").strip().lower()
    if sampler not in SAMPLERS:
        raise ConfigError(
            f"OTEL_TRACES_SAMPLER: unsupported sampler {sampler!r} (one of {', '.join(SAMPLERS)})"
        )
    sampler_arg = None
    if sampler.endswith("traceidratio"):
        raw = otel.get("OTEL_TRACES_SAMPLER_ARG", "1.0").strip() or "1.0"
        try:
            sampler_arg = float(raw)
        except ValueError:
            sampler_arg = -1.0
        if not 0.0 <= sampler_arg <= 1.0:
            raise ConfigError(f"OTEL_TRACES_SAMPLER_ARG: must be a ratio between 0 and 1, got {raw!r}")
    resource = {}
    for pair in otel.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = pair.partition("=")
        if sep and key.strip():
            resource[key.strip()] = value.strip()
    resource["service.name"] = (
        otel.get("OTEL_SERVICE_NAME", "").strip() or resource.get("service.name") or service_name
    )
    return TracingSettings(exporters, endpoint or OTLP_HTTP_DEFAULT, sampler, sampler_arg, resource)


def check(config: Config, otel: Mapping[str, str] | None = None) -> TracingSettings | None:
    """The start-up check (``gateway.startup``): raise on a setting the gateway cannot honour."""
    chosen = settings_from(otel_environ() if otel is None else otel, service_name="agentic-gateway")
    if chosen is not None:
        log.info(
            "tracing: %s to %s (sampler %s)%s",
            "+".join(chosen.exporters),
            chosen.endpoint,
            chosen.sampler,
            "; prompts and completions captured" if config.observability.capture_content else "",
        )
    return chosen


class _State:
    provider: TracerProvider | None = None
    excluded_urls: str | None = None  # OTEL_PYTHON_ASGI_EXCLUDED_URLS: no server span for these
    instrumentors: list[Any] = []


_state = _State()


def enabled() -> bool:
    """Whether this process traces (a provider was installed by :func:`setup`)."""
    return _state.provider is not None


def setup(
    config: Config,
    *,
    service_name: str = "agentic-gateway",
    otel: Mapping[str, str] | None = None,
    processor: SpanProcessor | None = None,
) -> bool:
    """Install tracing for this process when the ``OTEL_*`` variables (``otel``, default: the process
    environment) configure an exporter, or when a ``processor`` is given (tests: an in-memory
    exporter). Idempotent; returns whether tracing is on."""
    if _state.provider is not None:
        return True
    otel = otel_environ() if otel is None else otel
    chosen = settings_from(otel, service_name=service_name)
    if chosen is None and processor is None:
        return False
    # The SDK is imported only when tracing is on.
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    if chosen is None:
        chosen = TracingSettings((), "", "parentbased_always_on", None, {"service.name": service_name})
    sampler = _sampler(chosen)
    provider = TracerProvider(resource=Resource.create(chosen.resource), sampler=sampler)
    for processor_ in _processors(chosen) if processor is None else [processor]:
        provider.add_span_processor(processor_)
    trace.set_tracer_provider(provider)
    _state.provider = provider
    _state.excluded_urls = otel.get("OTEL_PYTHON_ASGI_EXCLUDED_URLS") or otel.get("OTEL_PYTHON_EXCLUDED_URLS")
    _instrument(provider)
    return True


def _sampler(chosen: TracingSettings) -> Any:
    """The configured sampler, except that a client span with no parent (a database statement or an
    outbound call of a periodic job: the lease sweep, the ledger's batched writes, heartbeats) is
    not recorded: a trace starts at a request, a WebSocket response or a task."""
    from opentelemetry.sdk.trace import sampling as s

    ratio = chosen.sampler_arg if chosen.sampler_arg is not None else 1.0
    configured = {
        "always_on": s.ALWAYS_ON,
        "always_off": s.ALWAYS_OFF,
        "traceidratio": s.TraceIdRatioBased(ratio),
        "parentbased_always_on": s.ParentBased(s.ALWAYS_ON),
        "parentbased_always_off": s.ParentBased(s.ALWAYS_OFF),
        "parentbased_traceidratio": s.ParentBased(s.TraceIdRatioBased(ratio)),
    }[chosen.sampler]

    class NoOrphanClientSpans(s.Sampler):
        def should_sample(
            self,
            parent_context: Any,
            trace_id: int,
            name: str,
            kind: trace.SpanKind | None = None,
            attributes: Any = None,
            links: Any = None,
            trace_state: Any = None,
        ) -> s.SamplingResult:
            if (
                kind is trace.SpanKind.CLIENT
                and not trace.get_current_span(parent_context).get_span_context().is_valid
            ):
                return s.SamplingResult(s.Decision.DROP)
            return configured.should_sample(
                parent_context, trace_id, name, kind, attributes, links, trace_state
            )

        def get_description(self) -> str:
            return f"NoOrphanClientSpans{{{configured.get_description()}}}"

    return NoOrphanClientSpans()


def _processors(chosen: TracingSettings) -> list[SpanProcessor]:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    processors: list[SpanProcessor] = []
    if "otlp" in chosen.exporters:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        # Headers, TLS files, compression and the export timeout: the exporter reads OTEL_* itself.
        # The batch processor never blocks a request: a dead collector drops spans when its queue is full.
        processors.append(BatchSpanProcessor(OTLPSpanExporter(endpoint=chosen.endpoint)))
    if "console" in chosen.exporters:
        processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
    return processors


def _instrument(provider: TracerProvider) -> None:
    """The maintained instrumentations: outbound aiohttp, Celery, and the database drivers."""
    from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.sqlite3 import SQLite3Instrumentor

    instrumentors: list[tuple[Any, dict[str, Any]]] = [
        (AioHttpClientInstrumentor(), {}),
        (CeleryInstrumentor(), {}),
        (PsycopgInstrumentor(), {"enable_commenter": False, "skip_dep_check": True}),
        (SQLite3Instrumentor(), {}),
    ]
    for instrumentor, options in instrumentors:
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(tracer_provider=provider, **options)
            _state.instrumentors.append(instrumentor)


def shutdown() -> None:
    """Export what is queued and remove the provider and instrumentations (tests; process exit
    flushes through the SDK's own exit handler)."""
    provider, _state.provider = _state.provider, None
    for instrumentor in _state.instrumentors:
        instrumentor.uninstrument()
    _state.instrumentors = []
    _state.excluded_urls = None
    if provider is not None:
        provider.shutdown()


# --- The server side: one span per HTTP request and per WebSocket upgrade -------------------------


def span_name(scope: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``"POST /v1/responses/{id}/cancel"``: method and path with ids templated (bounded names)."""
    path = _ID_SEGMENT.sub("/{id}", scope.get("path", ""))
    method = scope.get("method", "")
    return (f"{method} {path}" if method else path), {}


def instrument_asgi(app: Any) -> Any:
    """``app`` with a server span around each HTTP request (the ASGI instrumentation, outside the
    fast path, so pass-through is covered) and a short span per WebSocket upgrade; ``app`` itself
    when tracing is off."""
    if _state.provider is None:
        return app
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    http = OpenTelemetryMiddleware(
        app,
        excluded_urls=_state.excluded_urls,  # e.g. "health,ready,metrics" (regexes, comma-separated)
        default_span_details=span_name,
        tracer_provider=_state.provider,
        http_capture_headers_sanitize_fields=SANITIZED_HEADERS,
        # A span per body chunk sent or received would outnumber the request's own spans many times.
        exclude_spans=["receive", "send"],
    )
    return _TracedApp(app, http)


class _TracedApp:
    def __init__(self, app: Any, http: Any) -> None:
        self.app = app
        self.http = http

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "http":
            await self.http(scope, receive, send)
        elif kind == "websocket":
            await _websocket(self.app, scope, receive, send)
        else:
            await self.app(scope, receive, send)


UPGRADE_SPAN = "gateway.upgrade_span"  # the scope key of the upgrade span's context (for links)


async def _websocket(app: Any, scope: Any, receive: Any, send: Any) -> None:
    """The upgrade's server span ends when the handshake is answered: a connection may live for
    hours, and each response on it is a trace of its own (:func:`websocket_response_span`)."""
    parent = propagate.extract(_header_carrier(scope))
    tracer = trace.get_tracer(TRACER_NAME)
    name, _ = span_name(scope)
    span = tracer.start_span(
        f"WebSocket {name}",
        context=parent,
        kind=trace.SpanKind.SERVER,
        attributes={"url.path": scope.get("path", ""), "url.scheme": scope.get("scheme", "ws")},
    )
    scope[UPGRADE_SPAN] = span.get_span_context()
    answered = False

    async def traced_send(message: dict[str, Any]) -> None:
        nonlocal answered
        if not answered and message["type"] in (
            "websocket.accept",
            "websocket.close",
            "websocket.http.response.start",
        ):
            answered = True
            accepted = message["type"] == "websocket.accept"
            span.set_attribute("http.response.status_code", 101 if accepted else message.get("status", 403))
            if not accepted:
                span.set_status(trace.StatusCode.ERROR)
            span.end()
        await send(message)

    token = otel_context.attach(trace.set_span_in_context(span, parent))
    try:
        await app(scope, receive, traced_send)
    finally:
        otel_context.detach(token)
        if not answered:
            span.end()


def _header_carrier(scope: Mapping[str, Any]) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ()) if k in _PROPAGATED}


_PROPAGATED = {b"traceparent", b"tracestate", b"baggage"}


@contextmanager
def websocket_response_span(
    scope: Mapping[str, Any], name: str = "WebSocket response.create"
) -> Iterator[None]:
    """One response on a WebSocket: a root span of its own (linked to the upgrade span), current
    while the response runs, so its rounds, tool calls and upstream requests are its children."""
    if _state.provider is None:
        yield
        return
    upgrade = scope.get(UPGRADE_SPAN)
    links = [trace.Link(upgrade)] if upgrade is not None and upgrade.is_valid else []
    tracer = trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(
        name,
        context=otel_context.Context(),  # a new trace, not the hours-long connection's
        kind=trace.SpanKind.SERVER,
        links=links,
        attributes={"url.path": scope.get("path", "")},
    ):
        yield


def with_trace_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``headers`` for an engine request made in process (no HTTP client span carries them): any
    ``traceparent``/``tracestate`` replaced by the current span's, so vLLM's own spans (when its
    ``--otlp-traces-endpoint`` is set) continue this trace. Unchanged when tracing is off."""
    if _state.provider is None:
        return headers
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if not carrier:
        return headers
    kept = [(k, v) for k, v in headers if k.lower() not in carrier]
    return [*kept, *carrier.items()]


def tag_request(request_id: str) -> None:
    """Record the gateway's request id on the current (server) span."""
    trace.get_current_span().set_attribute("gateway.request_id", request_id)


def log_ids() -> tuple[str, str]:
    """The current span's trace and span id as hex (``("", "")`` when there is none)."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return "", ""
    return format(context.trace_id, "032x"), format(context.span_id, "016x")
