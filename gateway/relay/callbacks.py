"""The callback relay's entry point, kept only until ``gateway/relay`` goes (issue 56): its lean
upstream client is gone, so every pass-through request takes the ASGI fast path
(``gateway.fastpath``, through ``inference_app.upstream.HttpUpstream``)."""

from __future__ import annotations

from typing import Any


def start(protocol: Any, cycle: Any, route: Any) -> bool:
    """Never relay on callbacks: False sends the request to the ASGI fast path."""
    return False
