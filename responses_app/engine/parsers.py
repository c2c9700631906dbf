"""The two upstream stream parsers (``/v1/responses`` events and ``/v1/chat/completions`` chunks).

One parser per round (:func:`for_round`) turns SSE events into emitter calls; :func:`read` feeds it
the whole stream. Status, tier and incomplete details go to the round's ``RoundState``, usage to the
response's ``Usage``; an upstream error raises :class:`~gateway.core.sse.StreamFailure`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from gateway.core import errors
from gateway.core.ids import new_id
from gateway.core.sse import Event, StreamFailure, read_sse
from responses_app.engine import upstream_events, wire
from responses_app.engine.domain import RoundState, Usage
from responses_app.engine.emitter import Emitter, as_str


class ResponsesParser:
    """Upstream ``/v1/responses`` events."""

    def __init__(self, emitter: Emitter, state: RoundState, usage: Usage) -> None:
        self.emitter = emitter
        self.state = state
        self.usage = usage

    def feed(self, name: str | None, data: bytes) -> tuple[list[Event], bool]:
        return self.handle(*upstream_events.responses_event(name, data))

    def whole(self, data: bytes) -> list[Event]:
        """A non-streamed answer (the Responses object): read as the stream's terminal event."""
        response = upstream_events.responses_answer(data)
        kind = "response.failed" if response.get("status") == "failed" else "response.completed"
        events, _ = self.handle(kind, {"type": kind, "response": response})
        return events

    def handle(self, kind: str, event: dict[str, Any]) -> tuple[list[Event], bool]:
        """One checked upstream event: our events, and whether it ended the stream."""
        em, state = self.emitter, self.state
        index = event.get("output_index")
        key = ("r", state.number, index)
        out: list[Event] = []
        if kind in upstream_events.STREAMED_OUTPUT:
            state.streamed = True
        state.settled = False
        if kind == "response.output_item.added":
            item = event["item"]
            itype = item.get("type")
            if itype in ("message", "reasoning"):
                out += em.ensure(key, itype)
            elif itype in ("function_call", "custom_tool_call"):
                out += em.ensure(key, itype, call_id=item.get("call_id"), name=item.get("name"))
        elif kind == "response.output_text.delta":
            out += em.text(key, as_str(event.get("delta")))
        elif kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            out += em.reasoning(key, as_str(event.get("delta")))
        elif kind in ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta"):
            out += em.call_delta(key, as_str(event.get("delta")))
        elif kind == "response.output_item.done":
            out += em.item_done(key, event["item"])
            state.settled = em.open is None
        elif kind in ("response.completed", "response.incomplete"):
            response = event["response"]
            out += em.close()
            if not state.streamed:
                # An upstream that sends its output only in the terminal event: taken from there.
                for position, item in enumerate(response.get("output") or ()):
                    out += em.item_done(("r", state.number, "terminal", position), item)
                out += em.close()
            usage = response.get("usage")
            if isinstance(usage, dict):
                self.usage.add_reported(usage)
            state.response_id, state.response_model = response.get("id"), response.get("model")
            tier = response.get("service_tier")
            state.tier = tier if isinstance(tier, str) else None
            # vLLM ends a length-capped response with ``response.completed`` whose status says
            # ``incomplete``: the status field decides, not only the event name.
            if kind == "response.incomplete" or response.get("status") == "incomplete":
                state.status = "incomplete"
                state.incomplete_details = response.get("incomplete_details") or {
                    "reason": "max_output_tokens"
                }
            return out, True
        elif kind == "response.failed":
            error = (event.get("response") or {}).get("error") or {}
            raise StreamFailure(error.get("message") or "The upstream response failed.")
        elif kind == "error":
            raise StreamFailure(as_str(event.get("message")) or "The upstream stream reported an error.")
        return out, False


class ChatParser:
    """Upstream ``/v1/chat/completions`` chunks (``[DONE]`` ends the stream)."""

    def __init__(self, emitter: Emitter, state: RoundState, usage: Usage) -> None:
        self.emitter = emitter
        self.state = state
        self.usage = usage

    def feed(self, name: str | None, data: bytes) -> tuple[list[Event], bool]:
        if data == b"[DONE]":
            return [], True
        return self.handle(upstream_events.chat_chunk(data)), False

    def whole(self, data: bytes) -> list[Event]:
        """A non-streamed answer (a chat completion): read as the one chunk it would stream as."""
        return self.handle(upstream_events.chat_answer(data))

    def handle(self, chunk: dict[str, Any]) -> list[Event]:
        """One checked chunk: our events."""
        em, state = self.emitter, self.state
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else None
            raise StreamFailure(as_str(message) or "The upstream stream reported an error.")
        out: list[Event] = []
        if state.response_id is None:
            state.response_id, state.response_model = chunk.get("id"), chunk.get("model")
        if isinstance(chunk.get("service_tier"), str):
            state.tier = chunk["service_tier"]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage.add(
                input_tokens=usage.get("prompt_tokens"),
                output_tokens=usage.get("completion_tokens"),
                total=usage.get("total_tokens"),
                input_details=usage.get("prompt_tokens_details"),
                output_details=usage.get("completion_tokens_details"),
            )
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning") or delta.get("reasoning_content")
            if reasoning:
                out += em.reasoning(("c", state.number, "reasoning"), as_str(reasoning))
            if delta.get("content"):
                out += em.text(("c", state.number, "text"), as_str(delta["content"]))
            for call in delta.get("tool_calls") or ():
                key = ("c", state.number, "tool", call.get("index", 0))
                function = call.get("function") or {}
                if not em.is_open(key) and key not in em.closed_keys:
                    name_ = as_str(function.get("name"))
                    out += em.ensure(
                        key, "function_call", call_id=call.get("id") or new_id("call"), name=name_
                    )
                if function.get("arguments"):
                    out += em.call_delta(key, as_str(function["arguments"]))
            finish = choice.get("finish_reason")
            if finish is not None:
                state.finish_reason = finish
            if finish == "length":
                state.status = "incomplete"
                state.incomplete_details = {"reason": "max_output_tokens"}
            elif finish == "content_filter":
                state.status = "incomplete"
                state.incomplete_details = {"reason": "content_filter"}
        return out


Parser = ResponsesParser | ChatParser


def for_round(chat: bool, emitter: Emitter, state: RoundState, usage: Usage) -> Parser:
    """The parser of one round's upstream stream (chat chunks when ``chat``, else Responses events)."""
    return ChatParser(emitter, state, usage) if chat else ResponsesParser(emitter, state, usage)


async def read(
    parser: Parser, response: Any, max_line_bytes: int, steer_waiting: Callable[[], bool]
) -> AsyncIterator[Event]:
    """Our events from one round's upstream stream, up to its terminal event (the rest drained for reuse);
    a failure or early end is a :class:`StreamFailure`. With ``steer_waiting()`` the round stops at its
    next settled event and drops the rest."""
    state = parser.state
    terminal_seen = False
    try:
        async for name, data in read_sse(response, max_line_bytes):
            events, terminal_seen = parser.feed(name, data)
            for event in events:
                yield event
            if terminal_seen:
                break
            # Only a complete item lifecycle event establishes that started work settled
            # (chat completions has none: its rounds stop at their end).
            if state.settled and steer_waiting():
                state.steered = True
                return  # the caller closes the upstream request
    except errors.GatewayError as exc:
        raise StreamFailure(exc.message, status=exc.status) from None
    if not terminal_seen:
        raise StreamFailure("The upstream stream ended before the response was complete.")
    if not response.complete:
        await wire.drain(response)


async def read_whole(parser: Parser, response: Any, max_bytes: int) -> list[Event]:
    """Our events from one round's non-streamed answer, read whole (at most ``max_bytes``) as the stream's
    terminal event or chunk; any failure is a :class:`StreamFailure`."""
    return parser.whole(await upstream_events.read_answer(response, max_bytes))
