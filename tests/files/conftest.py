"""Fixtures for the Files and vector stores tests: the SDK on a live gateway, files in a temporary storage."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conversations.conftest import OWNER_HEADER, owned_gateway, sdk
from tests.servers import LiveServer


@pytest.fixture(autouse=True)
def file_storage(settings: Any, tmp_path: Path) -> Iterator[Path]:
    """The ``files`` storage in a directory of this test's own."""
    location = tmp_path / "files"
    settings.STORAGES = {
        **settings.STORAGES,
        "files": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(location)},
        },
    }
    yield location


@pytest.fixture
def held_ingestion(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Ingestion held back: attachments stay ``in_progress`` until the test sets their state (the
    tests of counts, statuses and cancel); the attachments that would have been scheduled are listed."""
    from files_app import ingest

    held: list[int] = []
    monkeypatch.setattr(ingest, "schedule", lambda pks: held.extend(pks))
    return held


def stored_names(location: Path) -> list[str]:
    return sorted(p.name for p in location.rglob("*") if p.is_file()) if location.exists() else []


@pytest.fixture
def client(live_gateway: LiveServer) -> openai.OpenAI:
    return sdk(live_gateway.url)


__all__ = ["OWNER_HEADER", "client", "file_storage", "held_ingestion", "owned_gateway", "sdk", "stored_names"]
