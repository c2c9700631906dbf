"""One trace across processes: a gateway and a real Celery worker (separate processes) export over
OTLP/HTTP to a collector stand-in (tests/otlp_collector.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.faults import CeleryWorker
from tests.otlp_collector import CollectedSpan, OtlpCollector
from tests.servers import GatewayProcess, process_database

pytestmark = pytest.mark.process

REDIS_URL = "redis://127.0.0.1:6379/4"
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
SERVER, CLIENT, PRODUCER, CONSUMER = 2, 3, 4, 5  # opentelemetry.proto Span.SpanKind


@pytest.fixture
def collector() -> Iterator[OtlpCollector]:
    server = OtlpCollector().start()
    yield server
    server.stop()


@pytest.fixture
def env(upstream: Any, collector: OtlpCollector, tmp_path: Path) -> Iterator[dict[str, str]]:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    database, scratch = process_database(tmp_path)
    yield {
        "LLM_API_BASE": upstream.url,
        "UPSTREAM_API": "chat_completions",
        "REDIS_URL": REDIS_URL,
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # export within a tenth of a second
        **database,
    }
    if scratch is not None:
        scratch.drop()
    client.flushdb()
    client.close()


def test_a_celery_worker_response_is_one_trace(
    env: dict[str, str], collector: OtlpCollector, upstream: Any
) -> None:
    gateway = GatewayProcess(env).wait()
    worker: CeleryWorker | None = None
    try:
        worker = CeleryWorker(env).wait_ready()
        created = httpx.post(
            f"{gateway.url}/v1/responses",
            json={"model": "m", "input": "x", "background": True},
            headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
            timeout=30,
        )
        assert created.status_code == 200, created.text
        rid = created.json()["id"]
        deadline = time.monotonic() + 30
        while httpx.get(f"{gateway.url}/v1/responses/{rid}", timeout=10).json()["status"] != "completed":
            assert time.monotonic() < deadline, "the background response did not complete"
            time.sleep(0.1)

        def complete(spans: list[CollectedSpan]) -> bool:
            ours = [s for s in spans if s.trace_id == CLIENT_TRACE]
            return any(s.kind == CONSUMER for s in ours) and any(
                s.kind == CLIENT and s.service == "agentic-gateway-worker" for s in ours
            )

        spans = collector.wait_for(complete)
    finally:
        if worker is not None:
            worker.stop()
        gateway.stop()
    ours = [s for s in spans if s.trace_id == CLIENT_TRACE]
    by_id = {s.span_id: s for s in ours}
    (server,) = [s for s in ours if s.kind == SERVER and s.name == "POST /v1/responses"]
    assert server.service == "agentic-gateway" and server.parent_span_id == CLIENT_SPAN
    (producer,) = [s for s in ours if s.kind == PRODUCER]
    assert producer.service == "agentic-gateway"
    (consumer,) = [s for s in ours if s.kind == CONSUMER]
    # The worker's task span continues the gateway's publish span, exported by the worker process.
    assert consumer.service == "agentic-gateway-worker"
    assert consumer.parent_span_id == producer.span_id
    # The worker's upstream request: its traceparent names the worker's exported client span.
    sent = upstream.last("/v1/chat/completions").headers["traceparent"]
    _, trace_id, parent, _ = sent.split("-")
    assert trace_id == CLIENT_TRACE
    assert by_id[parent].kind == CLIENT and by_id[parent].service == "agentic-gateway-worker"
    # The database driver's spans, in both processes (the worker stores the response).
    statements = {
        (s.service, s.name) for s in ours if s.attributes.get("db.system") in ("sqlite", "postgresql")
    }
    assert ("agentic-gateway", "INSERT") in statements, statements
    assert ("agentic-gateway-worker", "UPDATE") in statements or (
        "agentic-gateway-worker",
        "INSERT",
    ) in statements


def test_an_exporter_the_gateway_cannot_run_stops_start_up(tmp_path: Path) -> None:
    """gRPC without its exporter: one clear message from `manage.py serve`, no traceback."""
    import subprocess
    import sys

    from tests.servers import ROOT

    proc = subprocess.run(
        [sys.executable, "manage.py", "serve"],
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "GATEWAY_SERVER_DATA_DIR": str(tmp_path),
            "LLM_API_BASE": "http://127.0.0.1:9",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "OTEL_EXPORTER_OTLP_PROTOCOL: grpc is not supported" in proc.stderr
    assert "Traceback" not in proc.stderr
