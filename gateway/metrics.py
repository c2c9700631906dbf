"""Prometheus metrics of the gateway.

With one server process the metrics live in this process. With several (``[server] workers``),
``manage.py serve`` points ``PROMETHEUS_MULTIPROC_DIR`` at a fresh directory before it starts them,
every process records into its own files there, and ``/metrics`` (answered by any one of them) adds
them all up: counters and histograms summed over the workers, gauges summed over the live ones.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

from gateway.compat.prometheus import Observer, adder, forget_at_fork, request_observer
from gateway.config import environ_get

REGISTRY = CollectorRegistry(auto_describe=True)

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
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
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


# prometheus_client's own setting: where each process of a multi-process server writes its values.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def use_multiprocess_dir() -> None:
    """Before starting several server processes: give them a fresh directory to record into.

    Set in the environment the workers inherit, so their ``prometheus_client`` sees it at import;
    removed when this (the supervising) process exits. A directory already configured is kept.
    """
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
        return bytes(generate_latest(registry))
    return bytes(generate_latest(REGISTRY))


# One observer per (route, method, status) label set (gateway.compat.prometheus: the values behind
# the children, updated without labels()). Routes are bounded (``route_label``), so this stays small.
_observers: dict[tuple[str, str, int], Observer] = {}
# What adds to HTTP_IN_FLIGHT (gateway.compat.prometheus.adder), made on first use.
_in_flight: Observer | None = None


def in_flight(change: int) -> None:
    """A request begins (1) or ends (-1): ``HTTP_IN_FLIGHT.inc(change)``, as cheaply."""
    global _in_flight
    add = _in_flight
    if add is None:
        add = _in_flight = adder(HTTP_IN_FLIGHT)
    add(change)


def _forget() -> None:
    """In a forked child: the updaters made before the fork write to the parent's files."""
    global _in_flight
    _observers.clear()
    _in_flight = None


forget_at_fork(_forget)


def observe_request(route: str, method: str, status: int, seconds: float) -> None:
    """Count one answered HTTP request and record its duration (as ``inc()`` and ``observe()`` do)."""
    key = (route, method, status)
    observe = _observers.get(key)
    if observe is None:
        observe = _observers[key] = request_observer(HTTP_REQUESTS, HTTP_LATENCY, route, method, str(status))
    observe(seconds)
