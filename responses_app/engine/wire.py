"""The upstream wire: one round's request body in either format (``/v1/responses`` or
``/v1/chat/completions``), sending it, and reading what an upstream answers besides a stream.
The body builders are pure: prepared request, tool maps and history in, a JSON-ready dict out."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import orjson

from gateway.core import errors
from gateway.core.sse import StreamFailure
from inference_app.tools.base import GATEWAY_TOOL_TYPES
from responses_app.engine import translate, upstream_events
from responses_app.engine.domain import Prepared
from responses_app.features import async_tools
from responses_app.protocol.schemas import NOT_FORWARDED

if TYPE_CHECKING:
    from responses_app.engine.tool_loop import ToolLoop

CHAT_PATH = "/v1/chat/completions"
RESPONSES_PATH = "/v1/responses"
# Bound on how much of an upstream error body we read to report it.
MAX_ERROR_BODY = 64 * 1024
# Request fields the chat body sets itself (or cannot carry): not forwarded as they are.
_CHAT_SKIP = frozenset(
    {
        "model",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "text",
        "reasoning",
        "include",
        "truncation",
        "prompt",
        "top_logprobs",
    }
)


def common_forward(p: Prepared) -> dict[str, Any]:
    """Request fields forwarded on every round (request-scoped ones only when set)."""
    body = {k: v for k, v in p.raw.items() if k not in NOT_FORWARDED and k != "input"}
    for key in ("prompt_cache_key", "prompt_cache_retention", "service_tier"):
        if body.get(key) is None:
            body.pop(key, None)
    if p.prompt_cache_options is None:
        body.pop("prompt_cache_options", None)
    else:
        body["prompt_cache_options"] = p.prompt_cache_options
    return body


def responses_body(
    p: Prepared,
    client_tools: translate.ToolMap,
    tools: ToolLoop | None,
    items: list[dict[str, Any]],
    stream: bool = True,
) -> dict[str, Any]:
    """The ``/v1/responses`` body of one round over ``items`` (the history as the model sees it),
    for a stream or (``stream`` False) one answer."""
    body = common_forward(p)
    items = async_tools.model_view(items, chat=False)
    body["input"] = [translate.output_to_input(item) for item in items]
    if p.request.instructions is None:
        body.pop("instructions", None)
    # Client tools (mapped) plus, while max_tool_calls allows, one function per gateway tool.
    declared = async_tools.hint_responses_tools(
        client_tools.responses_tools(), async_tools.async_upstream_names(client_tools.client)
    )
    if tools is not None:
        declared = [t for t in declared if t.get("type") not in GATEWAY_TOOL_TYPES]
        declared += tools.responses_tools(())
    if declared:
        body["tools"] = declared
        body["parallel_tool_calls"] = p.request.parallel_tool_calls is True
    else:
        body.pop("tools", None)
        body.pop("parallel_tool_calls", None)
    if "tool_choice" in body:
        choice = client_tools.tool_choice(body["tool_choice"])
        body["tool_choice"] = tools.tool_choice(choice) if tools is not None else choice
    if tools is not None and "include" in body:
        include = tools.upstream_include(body["include"])
        if include is None:
            body.pop("include")
        else:
            body["include"] = include
    body["store"] = False
    body["stream"] = stream
    return body


def chat_body(
    p: Prepared,
    client_tools: translate.ToolMap,
    tools: ToolLoop | None,
    items: list[dict[str, Any]],
    stream: bool = True,
) -> dict[str, Any]:
    """The ``/v1/chat/completions`` body of one round over ``items``, for a stream (with usage) or
    one answer (vLLM refuses ``stream_options`` without ``stream``)."""
    r = p.request
    forwarded = common_forward(p)
    body: dict[str, Any] = {"model": r.model}
    body["messages"] = translate.items_to_messages(r.instructions, async_tools.model_view(items, chat=True))
    declared = async_tools.hint_chat_tools(
        client_tools.chat_tools(), async_tools.async_upstream_names(client_tools.client)
    )
    tool_choice = client_tools.tool_choice(r.tool_choice)
    if tools is not None:
        declared += tools.chat_tools()
        tool_choice = tools.tool_choice(tool_choice)
    if declared:
        body["tools"] = declared
        choice = translate.tool_choice_to_chat(tool_choice)
        if choice is not None:
            body["tool_choice"] = choice
        body["parallel_tool_calls"] = r.parallel_tool_calls is True
    if r.max_output_tokens is not None:
        body["max_completion_tokens"] = r.max_output_tokens
    response_format = translate.text_to_response_format(r.text)
    if response_format is not None:
        body["response_format"] = response_format
    if r.reasoning and r.reasoning.get("effort"):
        body["reasoning_effort"] = r.reasoning["effort"]
    # Everything else the upstream may act on: sampling, cache and tier fields, vLLM extras.
    for key, value in forwarded.items():
        if key not in _CHAT_SKIP:
            body[key] = value
    body["stream"] = stream
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def round_request(
    chat: bool,
    p: Prepared,
    client_tools: translate.ToolMap,
    tools: ToolLoop | None,
    items: list[dict[str, Any]],
    stream: bool = True,
) -> tuple[str, dict[str, Any]]:
    """The upstream path and body of one round over ``items``: ``/v1/chat/completions`` when
    ``chat``, else ``/v1/responses``; a stream, or one answer when not ``stream``."""
    if chat:
        return CHAT_PATH, chat_body(p, client_tools, tools, items, stream)
    return RESPONSES_PATH, responses_body(p, client_tools, tools, items, stream)


async def send(upstream: Any, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    """POST one round's body with the request's forwarded ``headers``; an unreachable upstream is a
    :class:`~gateway.core.sse.StreamFailure`."""
    accept = "text/event-stream" if body.get("stream") else "application/json"
    headers = {**headers, "content-type": "application/json", "accept": accept}
    try:
        return await upstream.send("POST", path, body=orjson.dumps(body), headers=headers)
    except errors.GatewayError as exc:
        raise StreamFailure(exc.message, status=exc.status) from None


async def status_error(response: Any) -> errors.GatewayError:
    """The error an upstream's non-200 answer stands for (:func:`upstream_events.status_error`),
    from at most :data:`MAX_ERROR_BODY` of its body."""
    raw = b""
    async for chunk in response:
        raw += chunk
        if len(raw) > MAX_ERROR_BODY:
            break
    return upstream_events.status_error(response.status, raw)


async def drain(response: Any, limit: int = 64 * 1024, timeout: float = 1.0) -> None:
    """Read what follows the terminal event so the pooled connection is reused rather than closed; bounded
    in bytes and time, and skipped when the body already arrived whole."""
    seen = 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in response:
                seen += len(chunk)
                if seen > limit:
                    return
    except (TimeoutError, errors.GatewayError):
        return
