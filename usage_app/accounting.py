"""Metrics and token-quota charges for each model call.

PLACEHOLDER (issue 58): helper A adds the Prometheus counters, helper D the quota charge."""

from __future__ import annotations

from typing import Any


def count(entry: Any) -> None:
    from usage_app import quotas

    quotas.charge(entry)
