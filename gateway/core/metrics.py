"""Prometheus metrics of the gateway, through prometheus_client's public API.

With several server processes ``manage.py serve`` sets ``PROMETHEUS_MULTIPROC_DIR`` and ``/metrics``
adds every process's files up. Labelled children are cached per label tuple.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.registry import Collector

from gateway.core.config import environ_get

REGISTRY = CollectorRegistry(auto_describe=True)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)

HTTP_REQUESTS = Counter(
    "gateway_http_requests_total",
    "HTTP requests answered, by route, method and status.",
    ["route", "method", "status"],
    registry=REGISTRY,
)
HTTP_LATENCY = Histogram(
    "gateway_http_request_duration_seconds",
    "Time from request start to the end of the response body, by route and method.",
    ["route", "method"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
HTTP_IN_FLIGHT = Gauge(
    "gateway_http_requests_in_flight",
    "HTTP requests being served now.",
    registry=REGISTRY,
    multiprocess_mode="livesum",
)
WS_OPEN = Gauge(
    "gateway_websocket_connections_open",
    "Open WebSocket connections.",
    registry=REGISTRY,
    multiprocess_mode="livesum",
)
RESPONSES_IN_FLIGHT = Gauge(
    "gateway_responses_in_flight",
    "Responses being generated now (any transport, background included).",
    registry=REGISTRY,
    multiprocess_mode="livesum",
)
TOOL_DURATION = Histogram(
    "gateway_tool_call_duration_seconds",
    "Gateway tool calls (run between model rounds), by tool type and outcome (ok, error).",
    ["tool", "outcome"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
UPSTREAM_UP = Gauge(
    "gateway_upstream_up",
    "Each HTTP upstream of the table (by base URL): 1 up, 0 out for a back-off after failing.",
    ["upstream"],
    registry=REGISTRY,
    multiprocess_mode="livemin",  # down when any server process has it out
)
UPSTREAM_FAILOVERS = Counter(
    "gateway_upstream_failovers_total",
    "Requests sent again to another upstream after this one failed before answering (connect "
    "error, 5xx or no head in time).",
    ["upstream"],
    registry=REGISTRY,
)
INFERENCE_PLACEMENTS = Counter(
    "gateway_inference_placements_total",
    "Model rounds of a lineage placed on an inference worker, by outcome: hit (the worker that served "
    "the lineage last), moved (that worker gone or over its load bound), new (a lineage's first "
    "round), fallback (no placement: the shared queue).",
    ["outcome"],
    registry=REGISTRY,
)
# The gateway's tool types (inference_app.tools.base.GatewayKind); anything else is counted as "other".
TOOL_TYPES = frozenset({"web_search", "web_fetch", "code_interpreter", "mcp", "file_search", "tool_search"})

# Collectors that read their values when scraped (the inference queues in Redis): registered here
# and, with several processes, on each scrape's own registry (:func:`exposition`).
_scrape_collectors: list[Collector] = []


def register_scrape_collector(collector: Collector) -> None:
    """Add ``collector`` to ``/metrics``, in place of one of its class registered before."""
    for old in [c for c in _scrape_collectors if type(c) is type(collector)]:
        _scrape_collectors.remove(old)
        REGISTRY.unregister(old)
    _scrape_collectors.append(collector)
    REGISTRY.register(collector)


# prometheus_client's own setting: where each process of a multi-process server writes its values.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def use_multiprocess_dir() -> None:
    """Give the server processes about to start a fresh metrics directory (in the environment they
    inherit; removed when this process exits). A directory already configured is kept."""
    if environ_get(MULTIPROC_ENV):
        return
    directory = tempfile.mkdtemp(prefix="gateway-metrics-")
    os.environ[MULTIPROC_ENV] = directory
    atexit.register(shutil.rmtree, directory, True)


def exposition() -> bytes:
    """The text exposition of every metric, over all server processes."""
    if environ_get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        for collector in _scrape_collectors:
            registry.register(collector)
        return bytes(generate_latest(registry))
    return bytes(generate_latest(REGISTRY))


# Cached children per (route, method, status): labels() locks and checks on every call. Routes are
# bounded, and a child made before a fork stays right in the child.
_children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
_tool_children: dict[tuple[str, bool], Histogram] = {}


def in_flight(change: int) -> None:
    """A request begins (1) or ends (-1)."""
    HTTP_IN_FLIGHT.inc(change)


def observe_request(route: str, method: str, status: int, seconds: float) -> None:
    """Count one answered HTTP request and record its duration."""
    key = (route, method, status)
    children = _children.get(key)
    if children is None:
        children = _children[key] = (
            HTTP_REQUESTS.labels(route, method, str(status)),
            HTTP_LATENCY.labels(route, method),
        )
    count, latency = children
    count.inc()
    latency.observe(seconds)


def responses_in_flight(change: int) -> None:
    """A response's run begins (1) or ends (-1)."""
    RESPONSES_IN_FLIGHT.inc(change)


def observe_tool_call(tool: str, ok: bool, seconds: float) -> None:
    """One gateway tool call's duration, by its type (bounded: unknown types are "other")."""
    key = (tool if tool in TOOL_TYPES else "other", ok)
    child = _tool_children.get(key)
    if child is None:
        child = _tool_children[key] = TOOL_DURATION.labels(key[0], "ok" if ok else "error")
    child.observe(seconds)


def upstream_up(base: str, up: bool) -> None:
    """An upstream of the table is up (1) or out for a back-off (0)."""
    UPSTREAM_UP.labels(base).set(1 if up else 0)


def upstream_failover(base: str) -> None:
    """A request that ``base`` failed before answering goes to another upstream."""
    UPSTREAM_FAILOVERS.labels(base).inc()
