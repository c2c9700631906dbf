"""The contracts of ``gateway/compat/``: each library internal the gateway relies on is there, and
each fallback works when it is not."""

from __future__ import annotations

import ast
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from gateway.compat import django as django_compat
from gateway.compat import prometheus

ROOT = Path(__file__).resolve().parents[2]


def _metrics() -> tuple[Any, Any, CollectorRegistry]:
    registry = CollectorRegistry()
    counter = Counter("t_requests", "t", ["route", "method", "status"], registry=registry)
    histogram = Histogram("t_seconds", "t", ["route", "method"], buckets=(0.1, 1), registry=registry)
    return counter, histogram, registry


def _observed(registry: CollectorRegistry) -> tuple[float | None, float | None, float | None]:
    labels = {"route": "/r", "method": "POST"}
    return (
        registry.get_sample_value("t_requests_total", {**labels, "status": "200"}),
        registry.get_sample_value("t_seconds_sum", labels),
        registry.get_sample_value("t_seconds_bucket", {**labels, "le": "1.0"}),
    )


def test_the_prometheus_internals_relied_on_are_there() -> None:
    assert prometheus.missing() == []
    counter, histogram, registry = _metrics()
    observe = prometheus.request_observer(counter, histogram, "/r", "POST", "200")
    observe(0.5)
    observe(0.05)
    assert _observed(registry) == (2.0, 0.55, 2.0)


def test_a_prometheus_internal_gone_is_found() -> None:
    _, histogram, _ = _metrics()

    class Renamed:  # a histogram child whose bounds moved
        _sum = _buckets = None

    assert prometheus.missing(histogram=Renamed()) == ["Histogram._upper_bounds"]
    assert prometheus.missing(counter=object(), histogram=histogram.labels("/r", "POST")) == [
        "Counter._value"
    ]


def test_a_multiprocess_value_internal_gone_is_found() -> None:
    class Counted:  # a multi-process value without its key
        _multiprocess = True
        _value = 0.0

        class _file:
            @staticmethod
            def write_value(key: Any, value: float, timestamp: float) -> None:
                return None

        def inc(self, amount: float) -> None:
            return None

    class Child:
        _value = Counted()

    assert prometheus.missing(counter=Child()) == ["MmapedValue._key"]


def test_prometheus_without_its_internals_counts_through_the_public_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(prometheus, "_usable", False)
    counter, histogram, registry = _metrics()
    observe = prometheus.request_observer(counter, histogram, "/r", "POST", "200")
    observe(0.5)
    assert _observed(registry) == (1.0, 0.5, 1.0)


# Run in a fresh interpreter: prometheus_client picks its value class (one process or several) at
# import, from PROMETHEUS_MULTIPROC_DIR.
_MULTIPROCESS_SCRIPT = """
import os, sys
from prometheus_client import CollectorRegistry, multiprocess
from gateway.compat import prometheus
from gateway.metrics import HTTP_IN_FLIGHT, HTTP_LATENCY, exposition, in_flight, observe_request

latency = HTTP_LATENCY.labels("/r", "POST")
assert HTTP_IN_FLIGHT._value._multiprocess and prometheus.missing(HTTP_IN_FLIGHT, latency) == []
assert prometheus.usable(HTTP_IN_FLIGHT, latency) is {usable}


def totals():
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    labels = {{"route": "/r", "method": "POST"}}
    return (
        registry.get_sample_value("gateway_http_requests_total", {{**labels, "status": "200"}}),
        registry.get_sample_value("gateway_http_request_duration_seconds_sum", labels),
        registry.get_sample_value("gateway_http_request_duration_seconds_bucket", {{**labels, "le": "0.005"}}),
        registry.get_sample_value("gateway_http_request_duration_seconds_bucket", {{**labels, "le": "+Inf"}}),
        registry.get_sample_value("gateway_http_requests_in_flight", {{}}),
    )


for seconds in (0.002, 0.5, 0.004):
    observe_request("/r", "POST", 200, seconds)
in_flight(1)
in_flight(1)
in_flight(-1)
print(totals())
child = os.fork()
if child == 0:  # the child's updates go to files of its own, never to the parent's
    observe_request("/r", "POST", 200, 0.001)
    in_flight(1)
    os._exit(0)
os.waitpid(child, 0)
observe_request("/r", "POST", 200, 2.0)
print(totals())
# Only the gateway's own metrics in /metrics: the internals were probed on them, not on probes.
assert b"compat_probe" not in exposition(), exposition()
"""


@pytest.mark.process
@pytest.mark.parametrize("usable", [True, False])
def test_multiprocess_metrics_count_as_the_public_api_does_across_a_fork(
    tmp_path: Path, usable: bool
) -> None:
    """With several server processes the values are updated without the multi-process value's lock
    and process check: the same totals as its public ``inc``, the in-flight gauge's live sum, and a
    forked child's updates in files of its own (the parent's not overwritten). Without the
    internals (another prometheus_client), the public API gives the same."""
    import subprocess
    import sys

    script = _MULTIPROCESS_SCRIPT.format(usable=usable)
    if not usable:
        script = "from gateway.compat import prometheus\nprometheus._usable = False\n" + script
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == repr((3.0, 0.506, 2.0, 3.0, 1.0))
    # The child's counts and its in-flight request are in its own files (prometheus_client sums
    # them until the process is marked dead); the parent's count after the fork lands on its own 3.
    assert second == repr((5.0, 2.507, 3.0, 5.0, 2.0))


def test_prometheus_on_another_version_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prometheus, "VERSION", "0.0.1")
    monkeypatch.setattr(prometheus, "_usable", None)
    assert prometheus.missing()[0].startswith("prometheus_client==0.0.1")
    counter, histogram, _ = _metrics()
    assert prometheus.usable(counter.labels("/r", "POST", "200"), histogram.labels("/r", "POST")) is False


def _loaded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The middleware paths the handlers created from now on load."""
    from django.core.handlers import base

    loaded: list[str] = []
    real = base.import_string

    def recording(path: str) -> Any:
        loaded.append(path)
        return real(path)

    monkeypatch.setattr(base, "import_string", recording)
    return loaded


def test_the_django_internals_relied_on_are_there(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    assert django_compat.missing() == []
    loaded = _loaded(monkeypatch)
    handler = django_compat.api_handler()
    assert isinstance(handler, django_compat.ApiASGIHandler)
    assert sorted(loaded) == sorted(m for m in settings.MIDDLEWARE if m not in settings.ADMIN_ONLY_MIDDLEWARE)
    assert set(settings.MIDDLEWARE) > set(loaded)


def test_django_without_its_internal_serves_the_full_stack(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, settings: Any
) -> None:
    monkeypatch.setattr(django_compat, "VERSION", (1, 0))
    loaded = _loaded(monkeypatch)
    handler = django_compat.api_handler()
    assert type(handler) is not django_compat.ApiASGIHandler
    assert sorted(loaded) == sorted(settings.MIDDLEWARE)
    assert [r.levelno for r in caplog.records if r.name == "gateway"] == [logging.WARNING]


def test_no_private_name_of_these_libraries_outside_compat() -> None:
    """Attribute access like ``x._name`` on objects of django/prometheus_client/corsheaders/logging
    is only in gateway/compat/ and gateway/relay/ (the fenced packages)."""
    offenders = []
    for package in ("gateway", "responses_app", "conversations_app", "inference_app"):
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT)
            if rel.parts[:2] in (("gateway", "compat"), ("gateway", "relay")) or "migrations" in rel.parts:
                continue
            source = path.read_text()
            tree = ast.parse(source)
            for node in ast.walk(tree):
                if not isinstance(node, ast.ImportFrom) or not node.module:
                    continue
                if node.module.split(".")[0] not in _LIBRARIES:
                    continue
                offenders += [f"{rel}: import {a.name}" for a in node.names if a.name.startswith("_")]
                if any(part.startswith("_") for part in node.module.split(".")):
                    offenders.append(f"{rel}: from {node.module}")
            offenders += [f"{rel}: .{name}" for name in _KNOWN_PRIVATE if f".{name}" in source]
    assert offenders == []


_LIBRARIES = {"django", "prometheus_client", "corsheaders", "logging", "uvicorn", "rest_framework"}
# The private names these libraries' objects have been reached through before (and could be again).
_KNOWN_PRIVATE = (
    "_value",
    "_sum",
    "_buckets",
    "_upper_bounds",
    "_fmt",
    "_style",
    "_request",
    "_is_rendered",
    "_start_asgi_task",
)
