"""A live gateway with tracing on, its spans in the SDK's in-memory exporter."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from gateway.core import tracing
from gateway.core.config import get_config
from tests.servers import LiveServer


def reset_tracing() -> None:
    """Remove the provider and instrumentations, and let a later test install a provider again (the
    API allows one per process: the same reset as opentelemetry-test-utils' ``reset_trace_globals``)."""
    tracing.shutdown()
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@dataclass
class Traced:
    server: LiveServer
    upstream: Any
    gateway_config: Callable[..., Any]
    exporter: InMemorySpanExporter

    @property
    def url(self) -> str:
        return self.server.url

    def finished(
        self, ready: Callable[[list[ReadableSpan]], bool], timeout: float = 5.0
    ) -> list[ReadableSpan]:
        """The finished spans once ``ready`` says they are all there (a server span ends after the
        answer's last byte, so the client may see the answer first)."""
        deadline = time.monotonic() + timeout
        while True:
            spans = list(self.exporter.get_finished_spans())
            if ready(spans) and all(s.end_time for s in spans):
                time.sleep(0.05)  # spans ending with the request's last steps
                return list(self.exporter.get_finished_spans())
            if time.monotonic() > deadline:
                raise AssertionError(f"spans not ready: {[s.name for s in spans]}")
            time.sleep(0.01)

    def restart(self) -> None:
        """Serve again with a freshly wrapped app (the instrumentation reads its variables when built)."""
        from gateway.asgi import application
        from inference_app.upstream.http import close_upstreams

        self.server.stop()
        self.server = LiveServer(tracing.instrument_asgi(application), on_stop=close_upstreams).start()
        self.exporter.clear()


@pytest.fixture
def memory_spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on in this process (no server), its spans in the returned exporter."""
    exporter = InMemorySpanExporter()
    tracing.setup(get_config(), otel={}, processor=SimpleSpanProcessor(exporter))
    try:
        yield exporter
    finally:
        reset_tracing()


@pytest.fixture
def traced_gateway(
    transactional_db: None, upstream: Any, gateway_config: Callable[..., Any]
) -> Iterator[Traced]:
    from gateway.asgi import application
    from inference_app.upstream.http import close_upstreams

    gateway_config(llm_api_base=upstream.url, upstream_api="chat_completions")
    exporter = InMemorySpanExporter()
    tracing.setup(get_config(), otel={}, processor=SimpleSpanProcessor(exporter))
    server = LiveServer(tracing.instrument_asgi(application), on_stop=close_upstreams).start()
    traced = Traced(server, upstream, gateway_config, exporter)
    try:
        yield traced
    finally:
        traced.server.stop()
        reset_tracing()
