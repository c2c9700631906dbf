"""The fast-route registry: the paths served below Django, filled in by the apps in ``AppConfig.ready()``.

Two kinds:

- :data:`RELAYED`: pass-through routes (a :class:`inference_app.upstream.forward.Route` each), relayed byte for
  byte by :func:`inference_app.upstream.forward.relay`. The gateway app registers Chat Completions,
  Completions, Embeddings, Audio, vLLM's own routes (``passthrough.VLLM_ROUTES``), the operator's
  ``[passthrough] extra_routes`` and the Anthropic Messages routes.
- :data:`HANDLERS`: paths an app serves with its own ASGI handler (``responses_app`` registers
  ``POST /v1/responses``), which admits the request through ``gateway.core.pipeline`` itself.

The serving code reads the registry and imports no app: the apps depend on the gateway, never the
other way round.
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
