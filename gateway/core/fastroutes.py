"""The fast-route registry: paths served below Django, filled in by the apps in ``AppConfig.ready()``.

:data:`RELAYED` holds the pass-through routes (relayed by :func:`inference_app.upstream.forward.relay`);
:data:`HANDLERS` the paths an app serves with its own ASGI handler (``POST /v1/responses``). The
serving code reads the registry and imports no app.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

ASGIHandler = Callable[[dict[str, Any], Any, Any], Awaitable[None]]

# path -> inference_app.upstream.forward.Route (the kernel imports no layer above it)
RELAYED: dict[str, Any] = {}
HANDLERS: dict[str, ASGIHandler] = {}


def relay(path: str, route: Any) -> None:
    """Serve ``path`` as a pass-through route."""
    RELAYED[path] = route


def handle(path: str, handler: ASGIHandler) -> None:
    """Serve ``path`` with ``handler`` (an ASGI callable) below Django."""
    HANDLERS[path] = handler
