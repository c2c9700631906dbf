"""OpenTelemetry tracing: the set-up from ``OTEL_*``, the server span per request, ``traceparent``
continued from the client and carried to the upstream, log lines with the ids, and nothing when off.

Spans are read from the SDK's in-memory exporter (``tests/core/tracing_fixtures.py``).
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import orjson
import pytest
from openai import OpenAI
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from gateway.core import tracing
from gateway.core.config import ConfigError, get_config, load_config, otel_environ
from gateway.core.logging import JsonFormatter, RequestIdFilter, TextFormatter
from tests.core.tracing_fixtures import Traced, memory_spans, traced_gateway  # noqa: F401
from tests.servers import LiveServer

pytestmark = pytest.mark.django_db(transaction=True)

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
SECRET = "sk-very-secret-credential-123"


def parent_of(traceparent: str) -> tuple[str, str]:
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00" and int(flags, 16) & 1, traceparent  # sampled
    return trace_id, span_id


def hexid(span: ReadableSpan) -> tuple[str, str]:
    ctx = span.get_span_context()
    assert ctx is not None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def server_spans(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return [s for s in spans if s.kind == SpanKind.SERVER]


# --- settings from OTEL_* ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "otel",
    [
        {},
        {"OTEL_SERVICE_NAME": "gw"},  # no exporter configured
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"},
    ],
)
def test_off_unless_an_exporter_is_configured(otel: dict[str, str]) -> None:
    assert tracing.settings_from(otel, service_name="s") is None


def test_settings_from_the_standard_variables() -> None:
    chosen = tracing.settings_from(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.25",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,service.name=ignored",
            "OTEL_SERVICE_NAME": "edge",
        },
        service_name="default",
    )
    assert chosen is not None
    assert chosen.endpoint == "http://collector:4318/v1/traces"
    assert (chosen.sampler, chosen.sampler_arg) == ("parentbased_traceidratio", 0.25)
    assert chosen.resource == {"deployment.environment": "prod", "service.name": "edge"}
    signal = tracing.settings_from(
        {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/custom",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x",
        },
        service_name="default",
    )
    assert signal is not None and signal.endpoint == "http://c:4318/custom"
    assert signal.resource["service.name"] == "default"
    named = tracing.settings_from({"OTEL_TRACES_EXPORTER": "otlp"}, service_name="d")
    assert named is not None and named.endpoint == "http://localhost:4318/v1/traces"


@pytest.mark.parametrize(
    ("otel", "message"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL: grpc is not supported"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "unsupported protocol 'http/json'"),
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER: unsupported sampler 'sometimes'"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "OTEL_TRACES_SAMPLER_ARG"),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "unsupported exporter 'zipkin'"),
    ],
)
def test_settings_the_gateway_cannot_honour_stop_start_up(otel: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tracing.check(get_config(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", **otel})


def test_otel_variables_and_capture_content_come_from_the_config_module() -> None:
    env = {"OTEL_SERVICE_NAME": "a", "GATEWAY_OBSERVABILITY_CAPTURE_CONTENT": "true", "HOME": "/"}
    assert otel_environ(env) == {"OTEL_SERVICE_NAME": "a"}
    assert load_config(env).observability.capture_content is True
    assert load_config({}).observability.capture_content is False


# --- off ------------------------------------------------------------------------------------------


def test_tracing_off_makes_no_span(live_gateway: LiveServer, upstream: Any, gateway_config: Any) -> None:
    """No exporter configured (the test environment): no provider, the app unwrapped, no header."""
    gateway_config(llm_api_base=upstream.url)
    assert not tracing.setup(get_config(), otel={})
    assert not tracing.enabled()
    assert not isinstance(trace.get_tracer_provider(), tracing_sdk_provider())
    assert not trace.get_tracer("t").start_span("x").is_recording()
    from gateway.asgi import application

    assert tracing.instrument_asgi(application) is application
    response = httpx.post(
        f"{live_gateway.url}/v1/chat/completions", json={"model": "m", "messages": []}, timeout=10
    )
    assert response.status_code == 200
    assert "traceparent" not in upstream.last("/v1/chat/completions").headers


def tracing_sdk_provider() -> type:
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider


# --- on: the server span, an incoming traceparent, the upstream's traceparent -------------------------


def test_pass_through_continues_the_client_trace_to_the_upstream(traced_gateway: Traced) -> None:  # noqa: F811
    gw = traced_gateway
    client = OpenAI(base_url=f"{gw.url}/v1", api_key="sk-test", max_retries=0)
    client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], extra_headers={"traceparent": TRACEPARENT}
    )
    client.close()
    spans = gw.finished(lambda s: any(x.kind == SpanKind.CLIENT for x in s))
    (server,) = server_spans(spans)
    assert server.name == "POST /v1/chat/completions"
    assert hexid(server)[0] == CLIENT_TRACE
    assert server.parent is not None and format(server.parent.span_id, "016x") == CLIENT_SPAN
    assert server.attributes is not None and server.attributes["gateway.request_id"]
    # The upstream's traceparent: the client's trace, and a parent span the gateway exported.
    upstream_trace, upstream_parent = parent_of(
        gw.upstream.last("/v1/chat/completions").headers["traceparent"]
    )
    assert upstream_trace == CLIENT_TRACE
    exported = {hexid(s)[1]: s for s in spans}
    assert upstream_parent in exported
    assert exported[upstream_parent].kind == SpanKind.CLIENT
    assert exported[upstream_parent].parent is not None
    assert exported[upstream_parent].parent.span_id == server.context.span_id


def test_a_request_without_traceparent_starts_a_trace(traced_gateway: Traced) -> None:  # noqa: F811
    gw = traced_gateway
    response = httpx.get(f"{gw.url}/v1/models", timeout=10)
    assert response.status_code == 200
    spans = gw.finished(lambda s: bool(server_spans(s)))
    (server,) = server_spans(spans)
    assert server.parent is None
    upstream_trace, upstream_parent = parent_of(gw.upstream.last("/v1/models").headers["traceparent"])
    assert upstream_trace == hexid(server)[0]
    assert upstream_parent in {hexid(s)[1] for s in spans}


def test_responses_executor_path_carries_the_trace_upstream(traced_gateway: Traced) -> None:  # noqa: F811
    """A stored response (the executor path). Its database spans: tests/core/test_tracing_processes.py
    (this process's connections may predate the instrumentation)."""
    gw = traced_gateway
    gw.gateway_config(upstream_api="chat_completions")
    client = OpenAI(base_url=f"{gw.url}/v1", api_key="sk-test", max_retries=0)
    created = client.responses.create(
        model="m", input="the prompt text", extra_headers={"traceparent": TRACEPARENT}
    )
    client.close()
    assert created.status == "completed"
    spans = gw.finished(
        lambda s: any(x.kind == SpanKind.SERVER for x in s) and any(x.kind == SpanKind.CLIENT for x in s)
    )
    (server,) = [s for s in server_spans(spans) if s.name == "POST /v1/responses"]
    assert hexid(server)[0] == CLIENT_TRACE
    upstream_trace, upstream_parent = parent_of(
        gw.upstream.last("/v1/chat/completions").headers["traceparent"]
    )
    assert upstream_trace == CLIENT_TRACE
    assert upstream_parent in {hexid(s)[1] for s in spans}
    # capture_content off (the default): the prompt is in no attribute.
    assert "the prompt text" not in _all_attribute_text(spans)


def test_no_credential_in_any_attribute(traced_gateway: Traced, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Even when an operator records every request header (the instrumentation's own variable)."""
    gw = traced_gateway
    monkeypatch.setenv("OTEL_INSTRUMENTATION_HTTP_CAPTURE_HEADERS_SERVER_REQUEST", ".*")
    gw.restart()
    response = httpx.post(
        f"{gw.url}/v1/chat/completions",
        json={"model": "m", "messages": []},
        headers={
            "authorization": f"Bearer {SECRET}",
            "x-api-key": SECRET,
            "cookie": f"session={SECRET}",
            "x-custom": "visible",
        },
        timeout=10,
    )
    assert response.status_code == 200
    spans = gw.finished(lambda s: bool(server_spans(s)))
    text = _all_attribute_text(spans)
    assert "visible" in text  # headers were recorded
    assert SECRET not in text


def _all_attribute_text(spans: list[ReadableSpan]) -> str:
    return orjson.dumps([dict(s.attributes or {}) for s in spans], default=str).decode()


def test_probes_can_be_left_out_with_the_standard_variable() -> None:
    import asyncio

    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tests.core.tracing_fixtures import reset_tracing

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def call(path: str) -> None:
        scope = {"type": "http", "method": "GET", "path": path, "headers": [], "query_string": b""}
        await traced(scope, None, lambda message: asyncio.sleep(0))

    exporter = InMemorySpanExporter()
    otel = {"OTEL_PYTHON_ASGI_EXCLUDED_URLS": "health,ready,metrics"}
    tracing.setup(get_config(), otel=otel, processor=SimpleSpanProcessor(exporter))
    try:
        traced = tracing.instrument_asgi(app)
        for path in ("/health", "/metrics", "/v1/models"):
            asyncio.run(call(path))
        assert [s.name for s in exporter.get_finished_spans()] == ["GET /v1/models"]
    finally:
        reset_tracing()


# --- log lines --------------------------------------------------------------------------------------


def _formatted(formatter: logging.Formatter) -> str:
    record = logging.LogRecord("gateway.test", logging.INFO, __file__, 1, "hello %s", ("there",), None)
    RequestIdFilter().filter(record)
    return formatter.format(record)


def test_log_lines_carry_the_trace_and_span_ids(memory_spans: Any) -> None:  # noqa: F811
    with trace.get_tracer("test").start_as_current_span("work") as span:
        trace_id = format(span.get_span_context().trace_id, "032x")
        span_id = format(span.get_span_context().span_id, "016x")
        entry = orjson.loads(_formatted(JsonFormatter()))
        line = _formatted(TextFormatter())
    assert (entry["trace_id"], entry["span_id"]) == (trace_id, span_id)
    assert f" trace_id={trace_id} span_id={span_id}] hello there" in line
    # Outside any span: empty.
    entry = orjson.loads(_formatted(JsonFormatter()))
    assert (entry["trace_id"], entry["span_id"]) == ("", "")
    assert _formatted(TextFormatter()).endswith("[-] hello there")


def test_the_access_log_line_has_the_server_spans_ids(traced_gateway: Traced) -> None:  # noqa: F811
    gw = traced_gateway
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Keep()
    handler.addFilter(RequestIdFilter())
    access = logging.getLogger("gateway.access")
    access.addHandler(handler)
    level = access.level
    access.setLevel(logging.INFO)
    try:
        httpx.get(f"{gw.url}/v1/models", headers={"traceparent": TRACEPARENT}, timeout=10)
        spans = gw.finished(lambda s: bool(server_spans(s)))
    finally:
        access.removeHandler(handler)
        access.setLevel(level)
    (server,) = server_spans(spans)
    (record,) = seen
    assert (record.trace_id, record.span_id) == hexid(server)  # type: ignore[attr-defined]


def test_a_statement_outside_any_trace_is_not_recorded(memory_spans: Any) -> None:  # noqa: F811
    """Periodic jobs' statements (sweeps, batched ledger writes) start no trace; within one they count."""
    import sqlite3

    db = sqlite3.connect(":memory:")  # through the sqlite3 instrumentation
    db.cursor().execute("SELECT 1").fetchall()
    assert memory_spans.get_finished_spans() == ()
    with trace.get_tracer("test").start_as_current_span("task") as task:
        db.cursor().execute("SELECT 2").fetchall()
    db.close()
    statement, _task = memory_spans.get_finished_spans()
    assert statement.name == "SELECT" and statement.kind == SpanKind.CLIENT
    assert statement.parent is not None and statement.parent.span_id == task.get_span_context().span_id


# --- the in-process engine ----------------------------------------------------------------------


def test_engine_requests_carry_the_current_span(memory_spans: Any) -> None:  # noqa: F811
    """The embedded engine and the inference worker hand vLLM the trace in its request headers."""
    given = [("content-type", "application/json"), ("traceparent", TRACEPARENT)]
    with trace.get_tracer("test").start_as_current_span("round") as span:
        headers = dict(tracing.with_trace_headers(given))
    assert headers["content-type"] == "application/json"
    trace_id, parent = parent_of(headers["traceparent"])
    assert (trace_id, parent) == (
        format(span.get_span_context().trace_id, "032x"),
        format(span.get_span_context().span_id, "016x"),
    )
    tracing.shutdown()
    assert tracing.with_trace_headers(given) == given  # off: as given


# --- WebSocket ----------------------------------------------------------------------------------------


def test_each_websocket_response_is_a_trace_of_its_own(traced_gateway: Traced) -> None:  # noqa: F811
    from websockets.sync.client import connect

    gw = traced_gateway
    gw.gateway_config(upstream_api="chat_completions")
    url = gw.url.replace("http://", "ws://") + "/v1/responses"
    with connect(url, additional_headers={"traceparent": TRACEPARENT}) as ws:
        for n in range(2):
            ws.send(orjson.dumps({"type": "response.create", "model": "m", "input": f"turn {n}"}).decode())
            while orjson.loads(ws.recv(timeout=10))["type"] != "response.completed":
                pass
    spans = gw.finished(lambda s: len([x for x in s if x.name == "WebSocket response.create"]) == 2)
    (upgrade,) = [s for s in spans if s.name == "WebSocket /v1/responses"]
    assert hexid(upgrade)[0] == CLIENT_TRACE  # the upgrade continues the client's trace
    assert upgrade.attributes is not None and upgrade.attributes["http.response.status_code"] == 101
    responses = [s for s in spans if s.name == "WebSocket response.create"]
    traces = {hexid(s)[0] for s in responses}
    assert len(traces) == 2 and CLIENT_TRACE not in traces  # each response its own trace
    for span in responses:
        assert span.parent is None
        assert [link.context.span_id for link in span.links] == [upgrade.context.span_id]
    # Each upstream request is in its response's trace, under a span the gateway exported.
    sent = [r for r in gw.upstream.requests if r.path == "/v1/chat/completions"]
    assert {parent_of(r.headers["traceparent"])[0] for r in sent} == traces
    exported = {hexid(s)[1] for s in spans}
    assert all(parent_of(r.headers["traceparent"])[1] in exported for r in sent)
