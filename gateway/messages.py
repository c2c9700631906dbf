"""Anthropic Messages: ``POST /v1/messages`` (also ``?beta=true``) and ``/v1/messages/count_tokens``.

Requests are forwarded to ``{LLM_API_BASE}`` with ``anthropic-version``, ``anthropic-beta`` and every
body field preserved (``system`` verbatim), and the answer is relayed byte for byte: upstream error
bodies are never rewritten, because Claude Code matches on their wording. ``x-api-key`` and
``Authorization`` are both accepted and forwarded unless the gateway consumed them. The gateway's
own errors on these paths use the Anthropic envelope (``gateway.errors`` picks it by path), and a
stream the upstream breaks off ends with an Anthropic ``error`` event.

The gateway tool loop on this route (Claude's web search / web fetch server tools) is a later
feature. Under ``manage.py serve`` a Messages request is usually relayed below ASGI
(``gateway.relay.callbacks``), which never parses the body; a request that declares gateway tools
must be routed to the ASGI fast path instead, where the loop goes (in place of
:func:`gateway.passthrough.relay` for such a request). The one place that decides which requests the
relay takes is :func:`gateway.relay.callbacks.start`.
"""

from __future__ import annotations

from gateway import errors
from gateway.passthrough import Route

ROUTES: dict[str, Route] = {
    "/v1/messages": Route("/v1/messages", stream_error=errors.anthropic_sse_error),
    "/v1/messages/count_tokens": Route("/v1/messages/count_tokens", stream_error=errors.anthropic_sse_error),
}
