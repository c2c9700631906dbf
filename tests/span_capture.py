"""An in-memory span exporter on the process's tracer provider, for the span tests.

The global provider can be set only once per process through the API: :func:`installed` swaps the
process's provider for one with the exporter and puts the earlier one (usually none) back after. :func:`request_spans`
wraps an ASGI app so that each HTTP request and WebSocket connection runs in a server span of its
own, as the server instrumentation would make it (the gateway's spans must nest under it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.util._once import Once

EXPORTER = InMemorySpanExporter()


def _set_global(provider: Any) -> None:
    """Replace the process's provider (the API allows one ``set``; tests swap it), or remove it."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    if provider is not None:
        trace.set_tracer_provider(provider)


PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))


@contextmanager
def installed() -> Iterator[TracerProvider]:
    """:data:`PROVIDER` (its spans in :data:`EXPORTER`, cleared) installed while inside; the provider
    before it (none, usually) is put back after, so tests that expect tracing off still find it off."""
    before = trace._TRACER_PROVIDER
    _set_global(PROVIDER)
    EXPORTER.clear()
    try:
        yield PROVIDER
    finally:
        _set_global(before)
        EXPORTER.clear()


@contextmanager
def no_provider() -> Iterator[None]:
    """No tracer provider installed while inside (the one before is put back after)."""
    before = trace._TRACER_PROVIDER
    _set_global(None)
    try:
        yield
    finally:
        _set_global(before)


def request_spans(app: Any) -> Any:
    """``app`` with each HTTP request and WebSocket connection in a SERVER span ("request <path>")."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await app(scope, receive, send)
            return
        tracer = trace.get_tracer("tests")  # the provider installed now (tests swap it)
        with tracer.start_as_current_span(f"request {scope['path']}", kind=SpanKind.SERVER):
            await app(scope, receive, send)

    return wrapped


def serve_traced_gateway() -> Iterator[Any]:
    """``tests.conftest.serve_gateway`` with :func:`request_spans` around the application."""
    from gateway.asgi import application
    from inference_app.upstream.http import close_upstreams
    from tests.servers import LiveServer
    from usage_app import writer

    server = LiveServer(request_spans(application), on_stop=close_upstreams).start()
    yield server
    server.stop()
    if writer.writer.pending:  # this test's ledger rows go to its own database
        writer.flush_now()


def finished() -> list[ReadableSpan]:
    return list(EXPORTER.get_finished_spans())


def named(spans: list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None
