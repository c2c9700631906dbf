"""The fast-route registry: the paths served below Django, filled in by the apps in ``AppConfig.ready()``.

Two kinds:

- :data:`RELAYED`: pass-through routes (a :class:`gateway.passthrough.Route` each), relayed byte for
  byte by :func:`gateway.passthrough.relay` on the ASGI path, or by the callback relay
  (``gateway.relay``) under ``manage.py serve``. The gateway app registers Chat Completions,
  Completions, Embeddings, Audio and the Anthropic Messages routes.
- :data:`HANDLERS`: paths an app serves with its own ASGI handler (``responses_app`` registers
  ``POST /v1/responses``), which admits the request through ``gateway.pipeline`` itself.
- :data:`SERVED`: the same paths' answer as a function of the admitted request (:data:`Served`),
  for the callback relay under ``manage.py serve`` (``gateway.relay``), which admits and finishes
  the request itself and writes the :class:`Answer`. The app's ASGI handler calls the same function.

The serving code reads the registry and imports no app: the apps depend on the gateway, never the
other way round.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

from gateway.auth import AuthResult
from gateway.passthrough import Route

ASGIHandler = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class Answer(Protocol):
    """A served request's answer (``responses_app.views.Outcome``): a sized ``body``, or ``frames``
    streamed as they come (each one write), then ``close``. Refusals are raised before it exists."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    frames: AsyncIterator[bytes] | None
    close: Callable[[], Awaitable[None]] | None


# (lower-cased headers, the whole body, the admission's result) -> the answer.
Served = Callable[[Mapping[str, str], bytes, AuthResult], Awaitable[Answer]]

RELAYED: dict[str, Route] = {}
HANDLERS: dict[str, ASGIHandler] = {}
SERVED: dict[str, Served] = {}


def relay(path: str, route: Route) -> None:
    """Serve ``path`` as a pass-through route."""
    RELAYED[path] = route


def handle(path: str, handler: ASGIHandler, served: Served | None = None) -> None:
    """Serve ``path`` with ``handler`` (an ASGI callable) below Django; ``served``: the answer
    ``handler`` gives, for the callback relay (``POST`` with a body of declared size)."""
    HANDLERS[path] = handler
    if served is not None:
        SERVED[path] = served
