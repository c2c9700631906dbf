"""Anthropic Messages: ``POST /v1/messages`` (also ``?beta=true``) and ``/v1/messages/count_tokens``.

Requests are forwarded to ``{LLM_API_BASE}`` with ``anthropic-version``, ``anthropic-beta`` and every
body field preserved (``system`` verbatim), and the answer is relayed byte for byte: upstream error
bodies are never rewritten, because Claude Code matches on their wording. ``x-api-key`` and
``Authorization`` are both accepted and forwarded unless the gateway consumed them. The gateway's
own errors on these paths use the Anthropic envelope (``gateway.core.errors`` picks it by path), and a
stream the upstream breaks off ends with an Anthropic ``error`` event.

A request that declares a server tool the gateway runs (web search, web fetch) is not relayed: the
route's ``divert`` (:func:`messages_app.server_tools.declares_gateway_tools`, the one decision) sends
it to the server-tool loop (from :func:`inference_app.upstream.forward.relay`, once the body is in).
``count_tokens`` of such a request is diverted the same way, to be counted
with the tools as the loop sends them upstream.
"""

from __future__ import annotations

from gateway.core import errors
from inference_app.upstream.forward import Route
from messages_app import server_tools as messages_tools

ROUTES: dict[str, Route] = {
    "/v1/messages": Route(
        "/v1/messages",
        stream_error=errors.anthropic_sse_error,
        divert=messages_tools.declares_gateway_tools,
        diverted=messages_tools.serve,
    ),
    "/v1/messages/count_tokens": Route(
        "/v1/messages/count_tokens",
        stream_error=errors.anthropic_sse_error,
        divert=messages_tools.declares_gateway_tools,
        diverted=messages_tools.serve_count_tokens,
    ),
}
