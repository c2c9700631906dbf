"""An OTLP/HTTP collector stand-in: ``POST /v1/traces`` with protobuf, decoded with opentelemetry-proto.

What other processes (a gateway, a Celery worker) export arrives here, so a test can check one trace
across processes, and ``bench/tracing.py`` has a local collector that costs little.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.servers import free_port, wait_port


@dataclass(frozen=True)
class CollectedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    kind: int  # opentelemetry.proto Span.SpanKind: 2 server, 3 client, 4 producer, 5 consumer
    attributes: dict[str, Any]


def _value(any_value: Any) -> Any:
    field = any_value.WhichOneof("value")
    return getattr(any_value, field) if field else None


class OtlpCollector:
    """A loopback OTLP/HTTP receiver in a daemon thread; ``keep=False`` only counts spans (bench)."""

    def __init__(self, *, keep: bool = True) -> None:
        self.port = free_port()
        self.keep = keep
        self.spans: list[CollectedSpan] = []
        self.received = 0  # spans
        self.requests = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    @property
    def endpoint(self) -> str:
        """The base URL for ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
        return f"http://127.0.0.1:{self.port}"

    async def _traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest.FromString(body)
        collected = []
        count = 0
        for resource_spans in export.resource_spans:
            attrs = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            service = str(attrs.get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                count += len(scope_spans.spans)
                if not self.keep:
                    continue
                for span in scope_spans.spans:
                    collected.append(
                        CollectedSpan(
                            service,
                            span.name,
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            span.kind,
                            {a.key: _value(a.value) for a in span.attributes},
                        )
                    )
        with self._lock:
            self.spans.extend(collected)
            self.received += count
            self.requests += 1
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/traces", self._traces)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self._stop = asyncio.Event()
        await self._stop.wait()
        await runner.cleanup()

    def start(self) -> OtlpCollector:
        self._thread.start()
        wait_port(self.port)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def wait_for(
        self, ready: Callable[[list[CollectedSpan]], bool], timeout: float = 20.0
    ) -> list[CollectedSpan]:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                spans = list(self.spans)
            if ready(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"spans not collected: {sorted({(s.service, s.name) for s in spans})}")
            time.sleep(0.05)
