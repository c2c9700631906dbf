"""The contracts of ``gateway/compat/``: each library internal the gateway relies on is there, and
each fallback works when it is not."""

from __future__ import annotations

import ast
import logging
from pathlib import Path
from typing import Any

import pytest

from gateway.compat import django as django_compat

ROOT = Path(__file__).resolve().parents[2]


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
