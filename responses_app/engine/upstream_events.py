"""Typed parsing of what the upstream streams to the executor, on both wires.

Every member the executor acts on is checked strictly (``"12"`` is not a token count); anything
else is a :class:`StreamFailure` naming the event and member, never a crash or zeroed usage. Events
keep only the declared members (deltas are the most frequent event; nothing else is copied); tool
arguments sent as JSON values become their JSON text.
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from pydantic import BeforeValidator, ConfigDict, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict

from gateway.core import errors
from gateway.core.sse import StreamFailure

_STRICT = ConfigDict(extra="allow", strict=True)
_STRICT_ONLY = ConfigDict(extra="ignore", strict=True)  # the declared members only


def _json_text(value: Any) -> Any:
    return orjson.dumps(value).decode() if isinstance(value, dict | list) else value


# Tool-call arguments: a string, or a JSON object/array serialized as JSON (never Python's repr).
Arguments = Annotated[str, BeforeValidator(_json_text)]
# Usage details: counters, and vLLM's per-turn lists (``input_tokens_per_turn`` …, vLLM 0.32), which
# are accepted and not summed.
Counts = dict[str, int | list[int] | None]


# --- /v1/responses events ------------------------------------------------------------------------


@with_config(_STRICT)
class Part(TypedDict, total=False):
    type: str
    text: str
    refusal: str


@with_config(_STRICT)
class Item(TypedDict, total=False):
    type: str  # required below (``_ItemRequired``)
    id: str | None
    status: str | None
    call_id: str | None
    name: str | None
    arguments: Arguments | None
    input: str | None
    content: list[Part] | None
    summary: list[Part] | None


@with_config(_STRICT)
class ResponsesUsage(TypedDict, total=False):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: Counts | None
    output_tokens_details: Counts | None


@with_config(_STRICT)
class UpstreamError(TypedDict, total=False):
    message: str | None


@with_config(_STRICT_ONLY)
class ResponseBody(TypedDict, total=False):
    # For the round's span only, never checked: an odd value is left out there, not a failure.
    id: Any
    model: Any
    status: str | None
    usage: ResponsesUsage | None
    service_tier: str | None
    output: list[Item] | None
    incomplete_details: dict[str, Any] | None
    error: UpstreamError | None


@with_config(_STRICT_ONLY)
class ItemEvent(TypedDict, total=False):
    output_index: int | None
    item: Item


@with_config(_STRICT_ONLY)
class DeltaEvent(TypedDict, total=False):
    output_index: int | None
    delta: str


@with_config(_STRICT_ONLY)
class ResponseEvent(TypedDict, total=False):
    response: ResponseBody


@with_config(_STRICT)
class ErrorEvent(TypedDict, total=False):
    message: str | None


_ITEM_EVENT = TypeAdapter(ItemEvent)
_DELTA_EVENT = TypeAdapter(DeltaEvent)
_RESPONSE_EVENT = TypeAdapter(ResponseEvent)
_ERROR_EVENT = TypeAdapter(ErrorEvent)

# The events the executor acts on, by type; others are read for nothing but their type.
RESPONSES_EVENTS: dict[str, TypeAdapter[Any]] = {
    "response.output_item.added": _ITEM_EVENT,
    "response.output_item.done": _ITEM_EVENT,
    "response.output_text.delta": _DELTA_EVENT,
    "response.reasoning_text.delta": _DELTA_EVENT,
    "response.reasoning_summary_text.delta": _DELTA_EVENT,
    "response.function_call_arguments.delta": _DELTA_EVENT,
    "response.custom_tool_call_input.delta": _DELTA_EVENT,
    "response.completed": _RESPONSE_EVENT,
    "response.incomplete": _RESPONSE_EVENT,
    "response.failed": _RESPONSE_EVENT,
    "error": _ERROR_EVENT,
}
# The upstream's opening events: the executor makes its own response object, so only theirs being an
# object is checked (checking its members showed up in stored-stream profiles).
_OPENING = frozenset({"response.created", "response.in_progress"})
# Members an event of that type cannot do without.
_REQUIRED = {
    "response.output_item.added": ("item",),
    "response.output_item.done": ("item",),
    "response.completed": ("response",),
    "response.incomplete": ("response",),
}


def responses_event(name: str | None, data: bytes) -> tuple[str, dict[str, Any]]:
    """One upstream ``/v1/responses`` SSE event: its type and its checked members."""
    event = _object(data, "stream event")
    kind = event.get("type", name)
    if not isinstance(kind, str):
        raise _malformed("stream event", "'type' is not a string")
    adapter = RESPONSES_EVENTS.get(kind)
    if adapter is None:
        if kind in _OPENING and not isinstance(event.get("response", {}), dict):
            raise _malformed(f"'{kind}' event", "'response': input should be a valid dictionary")
        return kind, event
    for member in _REQUIRED.get(kind, ()):
        if member not in event:
            raise _malformed(f"'{kind}' event", f"'{member}' is missing")
    checked = _check(adapter, event, "event", kind=kind)
    if "item" in checked and "type" not in checked["item"]:
        raise _malformed(f"'{kind}' event", "'item.type' is missing")
    return kind, checked


# --- /v1/chat/completions chunks -----------------------------------------------------------------


@with_config(_STRICT)
class ChatFunction(TypedDict, total=False):
    name: str | None
    arguments: Arguments | None


@with_config(_STRICT)
class ChatToolCall(TypedDict, total=False):
    index: int
    id: str | None
    type: str | None
    function: ChatFunction | None


@with_config(_STRICT)
class ChatDelta(TypedDict, total=False):
    role: str | None
    content: str | None
    reasoning: str | None
    reasoning_content: str | None
    tool_calls: list[ChatToolCall] | None


@with_config(_STRICT)
class ChatChoice(TypedDict, total=False):
    index: int
    delta: ChatDelta | None
    finish_reason: str | None


@with_config(_STRICT)
class ChatUsage(TypedDict, total=False):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: Counts | None
    completion_tokens_details: Counts | None


@with_config(_STRICT)
class ChatChunk(TypedDict, total=False):
    id: Any  # for the round's span only, as ResponseBody's
    model: Any
    choices: list[ChatChoice] | None
    usage: ChatUsage | None
    service_tier: str | None


_CHAT_CHUNK = TypeAdapter(ChatChunk)


def chat_chunk(data: bytes) -> dict[str, Any]:
    """One upstream chat-completions chunk with its checked members; an ``error`` chunk is returned as
    it came, for the caller to raise."""
    chunk = _object(data, "stream chunk")
    if "error" in chunk:
        return chunk
    return _check(_CHAT_CHUNK, chunk, "stream chunk")


# A round whose events nobody reads live (a JSON client's) asks the upstream for one answer, checked
# by the same members as the stream it stands for.

_RESPONSE_BODY = TypeAdapter(ResponseBody)


async def read_answer(response: Any, max_bytes: int) -> bytes:
    """The whole body of a non-streamed answer, at most ``max_bytes``; more, or a failed read, is a
    :class:`StreamFailure`."""
    body = bytearray()
    try:
        async for chunk in response:
            body += chunk
            if len(body) > max_bytes:
                raise StreamFailure(
                    f"An upstream answer exceeded max_upstream_sse_line_bytes ({max_bytes} bytes)."
                )
    except errors.GatewayError as exc:
        raise StreamFailure(exc.message, status=exc.status) from None
    return bytes(body)


def status_error(status: int, raw: bytes, request: str = "") -> errors.GatewayError:
    """The error an upstream's non-200 answer stands for: a 4xx is the client's
    (``invalid_request_error``), anything else a 502. ``request`` names what was asked."""
    message = f"The upstream model server answered {status}{f' to {request}' if request else ''}."
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        payload = None
    detail = payload.get("error", payload) if isinstance(payload, dict) else None
    if isinstance(detail, dict) and isinstance(detail.get("message"), str):
        message = detail["message"]
    elif isinstance(payload, dict) and isinstance(payload.get("message"), str):
        message = payload["message"]
    if 400 <= status < 500:
        error = errors.GatewayError(message, status=status, code="upstream_error")
        error.type = "invalid_request_error"
        return error
    return errors.UpstreamError(message)


def responses_answer(data: bytes) -> dict[str, Any]:
    """A non-streamed ``/v1/responses`` answer: the Responses object, with its checked members
    (every output item has a type: the output is read from here alone)."""
    answer = _check(_RESPONSE_BODY, _object(data, "answer"), "answer")
    for position, item in enumerate(answer.get("output") or ()):
        if "type" not in item:
            raise _malformed("answer", f"'output[{position}].type' is missing")
    return answer


def chat_answer(data: bytes) -> dict[str, Any]:
    """A non-streamed ``/v1/chat/completions`` answer as the one stream chunk that carries it."""
    answer = _object(data, "answer")
    choices = answer.get("choices")
    if isinstance(choices, list):
        answer["choices"] = [_as_delta(choice) for choice in choices]
    return _check(_CHAT_CHUNK, answer, "answer", {"delta": "message"})


def _object(data: bytes, what: str) -> dict[str, Any]:
    """``data`` as a JSON object; anything else is a malformed ``what``."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise _malformed(what) from None
    if not isinstance(value, dict):
        raise _malformed(what, "expected a JSON object")
    return value


def _as_delta(choice: Any) -> Any:
    """A choice of a chat completion (``message``) as a chunk's choice (``delta``)."""
    if not isinstance(choice, dict) or "message" not in choice:
        return choice
    choice = dict(choice)
    message = choice.pop("message")
    if isinstance(message, dict) and isinstance(message.get("tool_calls"), list):
        message = dict(message)
        message["tool_calls"] = [
            {"index": index, **call} if isinstance(call, dict) else call
            for index, call in enumerate(message["tool_calls"])
        ]
    choice["delta"] = message
    return choice


def _check(
    adapter: TypeAdapter[Any],
    value: dict[str, Any],
    what: str,
    names: dict[str, str] | None = None,
    *,
    kind: str | None = None,
) -> dict[str, Any]:
    """``value`` checked by ``adapter`` into a new dict; a failure names the member (``names`` renames
    path members) and the event ``kind``."""
    try:
        # The adapter's validator itself (``TypeAdapter.validator``, public): its
        # ``validate_python`` wrapper adds a Python call and its keyword defaults to every check.
        checked: dict[str, Any] = adapter.validator.validate_python(value)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        path = _path(first["loc"], names or {})
        if kind is not None:
            what = f"'{kind}' {what}"
        raise _malformed(what, f"'{path}': {first['msg'].lower()}") from None
    return checked


def _malformed(what: str, detail: str | None = None) -> StreamFailure:
    """The failure of an upstream ``what`` that does not fit (``detail``: which member, and how)."""
    return StreamFailure(f"The upstream sent a malformed {what}{f': {detail}' if detail else ''}.")


def _path(loc: tuple[Any, ...], names: dict[str, str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.startswith("function-") or part in ("str", "int", "none"):
            continue  # validator labels, not members
        else:
            out += ("." if out else "") + names.get(part, part)
    return out


# Events that carry output as it is generated; an upstream that sends none of them in a round has
# its output taken from the terminal event.
STREAMED_OUTPUT = frozenset(
    {
        "response.output_item.added",
        "response.output_item.done",
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
    }
)
