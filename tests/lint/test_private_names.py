"""Other libraries' private names stay out of our code: only their public APIs are used."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_private_name_of_these_libraries() -> None:
    """No import of a private name of django/prometheus_client/corsheaders/logging/uvicorn/DRF, and
    none of the private attributes they were once reached through."""
    offenders = []
    for package in (
        "gateway",
        "responses_app",
        "messages_app",
        "passthrough_app",
        "conversations_app",
        "inference_app",
    ):
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT)
            if "migrations" in rel.parts:
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
