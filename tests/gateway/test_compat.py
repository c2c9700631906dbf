"""The contracts of ``gateway/compat/``: each library internal the gateway relies on is there, and
each fallback works when it is not."""

from __future__ import annotations

import ast
import logging
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


def test_prometheus_without_its_internals_counts_through_the_public_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(prometheus, "_usable", False)
    counter, histogram, registry = _metrics()
    observe = prometheus.request_observer(counter, histogram, "/r", "POST", "200")
    observe(0.5)
    assert _observed(registry) == (1.0, 0.5, 1.0)


def test_prometheus_on_another_version_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prometheus, "VERSION", "0.0.1")
    monkeypatch.setattr(prometheus, "_usable", None)
    assert prometheus.missing()[0].startswith("prometheus_client==0.0.1")
    assert prometheus.usable() is False


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
