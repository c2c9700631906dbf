"""Anthropic Messages: ``POST /v1/messages`` (also ``?beta=true``) and ``/v1/messages/count_tokens``.

Requests are relayed byte for byte, headers and body preserved; upstream error bodies are never
rewritten (Claude Code matches their wording). The gateway's own errors use the Anthropic envelope.
A request that declares a gateway server tool is diverted to the server-tool loop
(:func:`messages_app.server_tools.declares_gateway_tools`), for ``count_tokens`` too.
"""

from __future__ import annotations

from gateway.core import errors
from inference_app.upstream.forward import Route
from messages_app import lineage as messages_lineage
from messages_app import server_tools as messages_tools

ROUTES: dict[str, Route] = {
    "/v1/messages": Route(
        "/v1/messages",
        stream_error=errors.anthropic_sse_error,
        divert=messages_tools.declares_gateway_tools,
        diverted=messages_tools.serve,
        lineage=messages_lineage.of_body,
    ),
    "/v1/messages/count_tokens": Route(
        "/v1/messages/count_tokens",
        stream_error=errors.anthropic_sse_error,
        divert=messages_tools.declares_gateway_tools,
        diverted=messages_tools.serve_count_tokens,
    ),
}
