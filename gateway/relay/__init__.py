"""Everything below ASGI, fenced off: the uvicorn protocol subclass, the callback relay, their guard,
and the lean upstream HTTP client the relay is designed with.

What is here, and why (``docs/performance.md``, the decision record):

- :mod:`gateway.relay.protocol`: uvicorn's httptools protocol, subclassed. ``GatewayHttpProtocol``
  holds the ``[server]`` request limits (431/414/408, uvicorn's own refusals in our envelope) and
  writes a response's head together with its first body bytes; ``GatewayServerProtocol`` adds the
  callback relay, and runs the registered handlers (``POST /v1/responses``) on a ``HandlerCycle``:
  the same ASGI application below uvicorn's layers (``GatewayASGIMiddleware`` around the handler),
  without uvicorn's request cycle; ``DrainingWebSocketProtocol`` keeps WebSocket connections open
  through the graceful drain.
- :mod:`gateway.relay.callbacks`: the pass-through relay on callbacks (``Relay``) and the one
  decision of which requests it takes (``start``); it applies the rules through ``gateway.pipeline``
  like every other path.
- :mod:`gateway.relay.framing`: the bytes the server side writes, shared by the cycles and the
  relay: the status line, the chunked framing, and an answer's bytes held until the end of the loop
  turn that produced them (``HeldWrites``).
- :mod:`gateway.relay.http_client`: the lean upstream HTTP/1.1 client the relay is designed with
  (asyncio Protocols, ``httptools``' parser, a keep-alive pool per event loop; ``HttpPool.send_on``,
  ``Outbox`` and ``Sink`` are the relay's side of it). It relies on no library internal, so neither
  ``[server] direct_relay = false`` nor the fallback on a uvicorn mismatch switches it off: it is
  also the client of ``inference_app.upstream.HttpUpstream`` (the ASGI fast path's, the executor's,
  the Messages loop's upstream, in every process: server, Celery workers, management commands).
  ``inference_app`` may not import this package, so the gateway app hands ``HttpPool`` to the
  upstream factory in ``AppConfig.ready()`` (``inference_app.upstream.use_http_client``, typed by
  its ``HttpClient`` protocol).

This package imports only ``gateway``'s rules and errors, ``uvicorn`` and ``httptools`` (and the
standard library): the upstream and its header rule come through ``gateway.passthrough``
(``upstream_pool``, ``forward_headers``). ``make lint`` holds it to that, and to being the only
importer of ``httptools`` (import-linter contracts in ``pyproject.toml``).

Only this package imports ``uvicorn.protocols``. Pinned versions: uvicorn ``UVICORN_VERSION``
(0.54.0), httptools ``HTTPTOOLS_VERSION`` (0.9.0). The internals relied on (:data:`RELIED_ON`;
:func:`missing_internals` checks them, ``tests/gateway/test_relay_contract.py`` fails when one
moves):

- ``uvicorn.protocols.http.httptools_impl.HttpToolsProtocol`` methods ``_start_asgi_task``
  (overridden: the cycle's class is swapped for ``CoalescingCycle``, and a pipelined request is
  offered to the relay), ``on_response_complete`` (copied, with one keep-alive timer per
  connection), ``_unset_keepalive_if_required``, ``send_400_response`` (what ``data_received``
  calls when the parser refuses bytes), ``shutdown``, and the httptools callbacks
  ``on_message_begin``, ``on_url``, ``on_header``, ``on_headers_complete``, ``on_body``,
  ``on_message_complete``; its attributes ``app``, ``parser``, ``url``, ``headers``, ``expect_100_continue``,
  ``scope``, ``cycle``, ``pipeline``, ``flow``, ``tasks``, ``loop``, ``transport``,
  ``server_state``, ``limit_concurrency``, ``root_path``, ``timeout_keep_alive``,
  ``timeout_keep_alive_task``.
- ``RequestResponseCycle`` (subclassed as ``CoalescingCycle``; ``LeanCycle`` stands in for it on the
  relay, ``HandlerCycle`` for a registered handler's request, with its ASGI semantics) and its ``send``, ``receive``, ``run_asgi``, ``flow``, ``scope``, ``body``, ``more_body``,
  ``message_event``, ``response_started``, ``response_complete``, ``disconnected``,
  ``keep_alive``, ``transport``, ``default_headers``, ``on_response``.
- ``STATUS_LINE`` (the status lines uvicorn writes).
- ``uvicorn.protocols.websockets.websockets_sansio_impl.WebSocketsSansIOProtocol.shutdown`` and
  ``connection_made``, and its attributes ``loop``, ``transport``, ``handshake_complete`` and
  ``disconnected``. (Not uvicorn's legacy ``websockets_impl``, deprecated in 0.54: every connection
  it closed left memory behind.)

At start-up ``manage.py serve`` calls :func:`protocols`: on a uvicorn other than the pinned one, or
with an internal gone, it logs one warning and serves everything through stock uvicorn (``httptools``
and ``websockets-sansio``) and the ASGI fast path. ``[server] direct_relay = false`` switches the relay off
on purpose (the protocol with the request limits stays).
"""

from __future__ import annotations

import importlib
import inspect
import logging
from typing import Any

UVICORN_VERSION = "0.54.0"
HTTPTOOLS_VERSION = "0.9.0"

_HTTP = "uvicorn.protocols.http.httptools_impl"
_WS = "uvicorn.protocols.websockets.websockets_sansio_impl"

# (module, name, callables on it, attributes its instances set: (method whose source sets them, names))
RELIED_ON: list[tuple[str, str, tuple[str, ...], dict[str, tuple[str, ...]]]] = [
    (
        _HTTP,
        "HttpToolsProtocol",
        (
            "_start_asgi_task",
            "on_response_complete",
            "_unset_keepalive_if_required",
            "send_400_response",
            "shutdown",
            "on_message_begin",
            "on_url",
            "on_header",
            "on_headers_complete",
            "on_body",
            "on_message_complete",
        ),
        {
            "__init__": (
                "app",
                "parser",
                "cycle",
                "pipeline",
                "flow",
                "tasks",
                "loop",
                "server_state",
                "limit_concurrency",
                "root_path",
                "timeout_keep_alive",
                "timeout_keep_alive_task",
            ),
            "connection_made": ("transport",),
            "on_message_begin": ("url", "headers", "expect_100_continue", "scope"),
        },
    ),
    (
        _HTTP,
        "RequestResponseCycle",
        ("send", "receive", "run_asgi"),
        {
            "__init__": (
                "flow",
                "scope",
                "body",
                "more_body",
                "message_event",
                "response_started",
                "response_complete",
                "disconnected",
                "keep_alive",
                "transport",
                "default_headers",
                "on_response",
            ),
        },
    ),
    (_HTTP, "STATUS_LINE", (), {}),
    (
        _WS,
        "WebSocketsSansIOProtocol",
        ("shutdown", "connection_made"),
        {
            "__init__": ("loop", "handshake_complete", "disconnected"),
            "connection_made": ("transport",),
        },
    ),
]


def missing_internals() -> list[str]:
    """What this package relies on that the installed uvicorn/httptools lack (versions included)."""
    import httptools
    import uvicorn

    missing = []
    if uvicorn.__version__ != UVICORN_VERSION:
        missing.append(f"uvicorn=={UVICORN_VERSION} (installed: {uvicorn.__version__})")
    if httptools.__version__ != HTTPTOOLS_VERSION:
        missing.append(f"httptools=={HTTPTOOLS_VERSION} (installed: {httptools.__version__})")
    for module_name, name, callables, attributes in RELIED_ON:
        try:
            owner = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError):
            missing.append(f"{module_name}.{name}")
            continue
        missing += [f"{name}.{member}" for member in callables if not callable(getattr(owner, member, None))]
        for method, names in attributes.items():
            try:
                source = inspect.getsource(getattr(owner, method))
            except (AttributeError, OSError, TypeError):
                missing.append(f"{name}.{method}")
                continue
            missing += [
                f"{name}.{attr}"
                for attr in names
                if f"self.{attr} =" not in source and f"self.{attr}: " not in source
            ]
    return missing


def protocols(direct_relay: bool) -> tuple[Any, Any]:
    """The uvicorn ``http`` and ``ws`` protocols to serve with (what ``manage.py serve`` passes).

    The relay when ``direct_relay``, else the request limits alone; stock uvicorn, with one warning,
    when the installed uvicorn is not the one this package is built on.
    """
    missing = missing_internals()
    if missing:
        logging.getLogger("gateway").warning(
            "uvicorn differs from what gateway.relay is built on (%s): serving with stock uvicorn "
            "and the ASGI fast path, without the pass-through relay and the [server] request limits",
            ", ".join(missing),
        )
        return "httptools", "websockets-sansio"
    from gateway.relay.protocol import DrainingHttpProtocol, DrainingServerProtocol, DrainingWebSocketProtocol

    return (DrainingServerProtocol if direct_relay else DrainingHttpProtocol), DrainingWebSocketProtocol
