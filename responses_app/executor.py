"""The executor: inference rounds against the upstream, the exact OpenAI event stream, storage.

One response runs as rounds: send the whole history and the tools upstream (``/v1/responses`` or
``/v1/chat/completions``, by ``upstream_api``), read the upstream stream, and emit our own events
with our own item ids. When the model calls client tools (function, custom) the response ends
with those calls for the client to run; gateway-executed tools (web search, code interpreter, MCP)
run between rounds and the loop goes on, at most ``max_rounds`` times (``responses_app.tool_loop``).

Nothing fake is ever sent: a truncated or malformed upstream stream, an oversize SSE line or an
upstream error ends the response ``failed`` (stored as failed when ``store``), and the terminal
snapshot is written *before* the terminal event, so a write failure reaches the client as an
``error`` event instead of ``response.completed``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway import errors
from gateway.config import Config
from gateway.db import run_orm
from gateway.ids import new_id
from gateway.logging import request_id_var
from inference_app.tools.base import GATEWAY_TOOL_TYPES
from responses_app import translate, upstream_events
from responses_app.echo import echoed_tool, tool_usage
from responses_app.events import Event, EventSink, EventTooLarge, StreamFailure, error_frame, read_sse
from responses_app.schemas import NOT_FORWARDED, ResponseCreateRequest
from responses_app.tool_loop import ROUND_CAP_REASON, ToolLoop, web_search_available

log = logging.getLogger("responses.executor")

TERMINAL_EVENT = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
}
# Bound on how much of an upstream error body we read to report it.
_MAX_ERROR_BODY = 64 * 1024


@dataclass
class Prepared:
    """A validated request with its history resolved; everything the executor needs."""

    request: ResponseCreateRequest
    raw: dict[str, Any]
    owner: str
    response_id: str
    created_at: int
    history: list[dict[str, Any]]  # stored items this response continues from (ids set)
    new_items: list[dict[str, Any]]  # this request's input items (our ids set)
    items_to_insert: list[dict[str, Any]]  # the subset of new_items not stored yet
    store: bool
    headers: dict[str, str]
    previous_response_id: str | None = None
    conversation_id: str | None = None
    conversation_revision: int = 0
    prompt_cache_options: dict[str, Any] | None = None
    background: bool = False
    # The client tools as the upstream sees them (built, and collisions refused, at preparation).
    tool_map: translate.ToolMap | None = None


@dataclass
class Usage:
    """Usage summed over rounds. Absent counters stay absent; nothing is derived."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int | None = None
    input_details: dict[str, int] = field(default_factory=dict)
    output_details: dict[str, int] = field(default_factory=dict)
    reported: bool = False

    @staticmethod
    def _add_details(into: dict[str, int], details: Any) -> None:
        if not isinstance(details, dict):
            return
        for key, value in details.items():
            if isinstance(value, int) and not isinstance(value, bool):
                into[key] = into.get(key, 0) + value

    def add(
        self, *, input_tokens: Any, output_tokens: Any, total: Any, input_details: Any, output_details: Any
    ) -> None:
        self.reported = True
        self.input_tokens += input_tokens if isinstance(input_tokens, int) else 0
        self.output_tokens += output_tokens if isinstance(output_tokens, int) else 0
        if isinstance(total, int):
            self.total_tokens = (self.total_tokens or 0) + total
        self._add_details(self.input_details, input_details)
        self._add_details(self.output_details, output_details)

    def as_dict(self) -> dict[str, Any] | None:
        if not self.reported:
            return None
        total = self.total_tokens
        if total is None:
            total = self.input_tokens + self.output_tokens
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": dict(self.input_details),
            "output_tokens": self.output_tokens,
            "output_tokens_details": dict(self.output_details),
            "total_tokens": total,
        }


@dataclass
class _Open:
    key: Any
    kind: str  # message | reasoning | function_call | custom_tool_call
    item: dict[str, Any]
    index: int
    parts: list[str] = field(default_factory=list)
    buffered: bool = False  # custom tool over chat: the JSON arguments are decoded at the end
    hidden: bool = False  # a gateway tool call: nothing streams; the tool loop emits its public item


def strip_credentials(raw: dict[str, Any]) -> dict[str, Any]:
    """The request as stored: request-scoped credentials (MCP authorization/headers) removed."""
    out = dict(raw)
    if isinstance(out.get("tools"), list):
        out["tools"] = _stripped_tools(out["tools"])
    return out


def _stripped_tools(tools: list[Any]) -> list[Any]:
    from inference_app.tools import strip_credentials as strip_tool

    return [strip_tool(t) if isinstance(t, dict) else t for t in tools]


def base_snapshot(p: Prepared, status: str) -> dict[str, Any]:
    """The response object for ``p`` (no output yet): every field of the SDK's ``Response``, with
    OpenAI's defaults where the request set nothing."""
    r = p.request
    return {
        "id": p.response_id,
        "object": "response",
        "created_at": p.created_at,
        "status": status,
        "access_programs": None,
        "background": bool(r.background),
        "completed_at": None,
        "conversation": {"id": p.conversation_id} if p.conversation_id else None,
        "error": None,
        "image": None,
        "incomplete_details": None,
        "input_transformations": None,
        "instructions": r.instructions,
        "max_output_tokens": r.max_output_tokens,
        "max_tool_calls": r.max_tool_calls,
        "metadata": r.metadata or {},
        "model": r.model,
        "moderation": None,
        "output": [],
        "parallel_tool_calls": r.parallel_tool_calls is True,  # false unless asked for (spec)
        "previous_response_id": p.previous_response_id,
        "prompt": r.prompt,
        "prompt_cache_diagnostics": None,
        "prompt_cache_key": None,  # request-scoped, never echoed (spec)
        "prompt_cache_options": p.raw.get("prompt_cache_options"),
        "prompt_cache_retention": r.prompt_cache_retention,
        "reasoning": {"context": None, "effort": None, "summary": None, **(r.reasoning or {})},
        "safety_identifier": r.safety_identifier,
        "service_tier": r.service_tier or "auto",  # the served tier replaces it at the end
        "store": p.store,
        "temperature": 1.0 if r.temperature is None else r.temperature,
        "text": {"format": {"type": "text"}, "verbosity": "medium", **(r.text or {})},
        "tool_choice": r.tool_choice if r.tool_choice is not None else "auto",
        "tools": [echoed_tool(t) for t in _stripped_tools(r.tools or [])],
        "tool_usage": tool_usage([]),
        "top_logprobs": r.top_logprobs or 0,
        "top_p": 1.0 if r.top_p is None else r.top_p,
        "truncation": r.truncation or "disabled",
        "usage": None,
        "user": r.user,
    }


class Executor:
    def __init__(
        self,
        prepared: Prepared,
        config: Config,
        *,
        upstream: Any = None,
        event_fields: dict[str, Any] | None = None,
    ) -> None:
        from inference_app.upstream import get_upstream

        self.p = prepared
        self.config = config
        self.upstream = upstream or get_upstream()
        # ``event_fields`` (the WebSocket ``stream_id``) ride on every event and count toward
        # max_stream_event_bytes, as the client receives them.
        self.sink = EventSink(config.responses.max_stream_event_bytes, extra=event_fields)
        self.output: list[dict[str, Any]] = []
        self.open: _Open | None = None
        self.closed_keys: set[Any] = set()
        self.usage = Usage()
        self.service_tier: str | None = None
        self.error: dict[str, Any] | None = None
        self.incomplete_details: dict[str, Any] | None = None
        self.retained = 0
        self.http_error: errors.GatewayError | None = None
        self.final: dict[str, Any] | None = None  # the terminal snapshot once sent
        self.failure_event: Event | None = None  # the error event, when one ended the stream
        self.stored = False
        self.store_refusal: errors.GatewayError | None = None  # set when storing was refused
        self._round = 0
        self._round_status = "completed"
        self._round_tier: str | None = None
        self._round_streamed = False  # this round's output came as item events (not only at the end)
        self._finishing = False  # _finish has begun: an error there ends with an ``error`` event
        # Background runs flush their persisted events here, before the terminal snapshot is written.
        self.before_store: Any = None
        # A stored stream writes its ``in_progress`` row here, before response.created (runs.drive).
        self.before_start: Any = None
        self.initial_status = "queued" if prepared.background else "in_progress"
        # Client tools as the model sees them (namespaces flattened, custom tools as functions).
        self.client_tools = prepared.tool_map or translate.ToolMap.build(
            prepared.request.tools, search_available=web_search_available(config)
        )
        self.tools: ToolLoop | None = None  # gateway tools, set by prepare_tools (before the response starts)
        self._round_client_calls = 0
        self._base: dict[str, Any] | None = None

    async def prepare_tools(self) -> None:
        """Classify tools, validate, discover MCP tools: every refusal is a 400 before any byte."""
        if self.tools is None:
            self.tools = await ToolLoop.prepare(self.p, self.config)

    # --- the response object -------------------------------------------------------------------

    def snapshot(self, status: str) -> dict[str, Any]:
        # The request's part of the object is built once per response (each snapshot is a fresh
        # top-level dict; the nested request values are shared, and nothing mutates them).
        if self._base is None:
            self._base = base_snapshot(self.p, status)
        snap = dict(self._base)
        snap["status"] = status
        snap["output"] = list(self.output)
        snap["usage"] = self.usage.as_dict()
        snap["tool_usage"] = tool_usage(self.output)
        if self.service_tier is not None:
            snap["service_tier"] = self.service_tier
        snap["error"] = self.error
        snap["incomplete_details"] = self.incomplete_details
        if status in ("completed", "incomplete", "failed", "cancelled"):
            snap["completed_at"] = int(time.time()) if status == "completed" else None
        return snap

    # --- the run -------------------------------------------------------------------------------

    async def run(self) -> AsyncIterator[Event]:
        """Every event of the response, in order, ending with exactly one terminal or error event.

        The one outermost guard of every streaming path (SSE, WebSocket, background): an unexpected
        exception is logged once, with the request id, and still ends the response ``failed``: a
        ``response.failed`` event once the response has started (an ``error`` event before), and
        the row stored as failed.
        """
        try:
            async for event in self._run():
                yield event
        except Exception:
            if self.final is not None or self.failure_event is not None:
                log.exception("response %s failed after its terminal event", self.p.response_id)
                return
            log.exception(
                "response %s failed unexpectedly (request %s); ending it failed",
                self.p.response_id,
                request_id_var.get(),
            )
            async for event in self._end_unexpected():
                yield event

    async def _end_unexpected(
        self, message: str = "The gateway failed while generating this response."
    ) -> AsyncIterator[Event]:
        if self.sink.sequence_number and not self._finishing:
            self._fail(message, "server_error", None)
            try:
                async for event in self._finish("failed"):
                    yield event
                return
            except Exception:
                log.exception("ending response %s failed", self.p.response_id)
                if self.final is not None or self.failure_event is not None:
                    return
        async for event in self._end_with_error("server_error", message):
            yield event

    async def _run(self) -> AsyncIterator[Event]:
        status = "completed"
        if self.tools is None:
            try:
                await self.prepare_tools()
            except errors.GatewayError as exc:  # callers that did not prepare (WebSocket, background)
                if self.p.background:  # its row exists: it must not stay in progress
                    self.error = {"code": exc.code or "server_error", "message": exc.message}
                    await self._store("failed", self.snapshot("failed"))
                self.failure_event = error_frame(
                    code=exc.code, message=exc.message, param=exc.param, sequence_number=0
                )
                yield self.failure_event
                return
        tools = self.tools
        assert tools is not None
        if self.before_start is not None:
            await self.before_start()
        try:
            yield self.sink.make("response.created", response=self.snapshot(self.initial_status))
            yield self.sink.make("response.in_progress", response=self.snapshot("in_progress"))
            for event in tools.listing_events(self):
                yield event
            async for event in tools.run_approvals(self):
                yield event
            max_rounds = self.config.responses.max_rounds
            for _ in range(max_rounds):
                self._round += 1
                self._round_client_calls = 0
                tools.start_round()
                async for event in self._run_round():
                    yield event
                for event in self._close():
                    yield event
                status = self._round_status
                self.service_tier = self._round_tier
                if not tools.round_calls:
                    break  # a final answer or client calls only: nothing for the gateway to run
                # Gateway calls run even when the round also ends the response (client calls,
                # approval requests, an incomplete round): they are recorded either way.
                async for event in tools.execute_round(self):
                    yield event
                if status != "completed" or self._round_client_calls or tools.ends_response:
                    break
            else:
                status = "incomplete"  # every round ended in gateway calls
                self.incomplete_details = {"reason": ROUND_CAP_REASON}
        except StreamFailure as failure:
            status = "failed"
            self._fail(failure.message, failure.code, failure.status)
        except EventTooLarge as exc:
            async for event in self._end_with_error("event_too_large", exc.message):
                yield event
            return
        async for event in self._finish(status):
            yield event

    async def interrupt(self, message: str) -> AsyncIterator[Event]:
        """End a run that was stopped from outside (the shutdown deadline) as ``failed``: the
        terminal event, and the stored row when it stores. Nothing when it had already ended."""
        if self.final is not None or self.failure_event is not None:
            return
        async for event in self._end_unexpected(message):
            yield event

    def _fail(self, message: str, code: str, status: int | None) -> None:
        self.open = None  # an unfinished item is not part of a failed response
        if status == 429:
            code = "rate_limit_exceeded"
        elif status is not None and 400 <= status < 500:
            code = "invalid_prompt"
        elif code not in ("server_error", "rate_limit_exceeded", "invalid_prompt"):
            code = "server_error"
        self.error = {"code": code, "message": message}

    async def _finish(self, status: str) -> AsyncIterator[Event]:
        self._finishing = True
        snapshot = self.snapshot(status)
        try:
            terminal = self.sink.make(TERMINAL_EVENT[status], response=snapshot)
        except EventTooLarge as exc:
            async for event in self._end_with_error("event_too_large", exc.message):
                yield event
            return
        if self.p.store:
            try:
                if self.before_store is not None:
                    await self.before_store()
                await self._store(status, snapshot, (terminal.data["sequence_number"], terminal.json))
            except errors.GatewayError as exc:
                # A refusal at commit time (a conversation race: 409 conversation_locked) is the
                # client's answer, not a storage failure.
                self.store_refusal = exc
                self.failure_event = error_frame(
                    code=exc.code or "storage_error",
                    message=exc.message,
                    param=exc.param,
                    sequence_number=terminal.data["sequence_number"],
                )
                yield self.failure_event
                return
            except Exception as exc:
                log.exception("storing response %s failed", self.p.response_id)
                message = f"The response could not be stored: {type(exc).__name__}."
                # What was generated is not stored; the row says failed, never completed.
                self.output = []
                await self._store_failed(message)
                self.failure_event = error_frame(
                    code="storage_error",
                    message=message,
                    param=None,
                    sequence_number=terminal.data["sequence_number"],
                )
                yield self.failure_event
                return
        self.final = snapshot
        yield terminal

    async def _end_with_error(self, code: str, message: str) -> AsyncIterator[Event]:
        """End with an ``error`` event (the terminal event itself cannot be sent); store as failed."""
        if self.p.store:
            await self._store_failed(message)
        self.failure_event = error_frame(
            code=code, message=message, param=None, sequence_number=self.sink.sequence_number
        )
        self.sink.sequence_number += 1
        yield self.failure_event

    async def _store_failed(self, message: str) -> None:
        """Store the response as ``failed`` with ``message`` (nothing else left to tell the client)."""
        self.open = None
        self.error = {"code": "server_error", "message": message}
        try:
            await self._store("failed", self.snapshot("failed"))
        except Exception:
            log.exception("storing failed response %s failed", self.p.response_id)

    async def _store(
        self, status: str, snapshot: dict[str, Any], terminal: tuple[int, bytes] | None = None
    ) -> None:
        from responses_app import services

        output_items = self.tools.stored_items(self.output) if self.tools else self.output
        outcome = services.Outcome(status, snapshot, output_items, self.usage.as_dict(), self.error, terminal)
        self.stored = await run_orm(services.response_store_final, prepared=self.p, outcome=outcome)

    # --- one upstream round --------------------------------------------------------------------

    def _history_items(self) -> list[dict[str, Any]]:
        return [*self.p.history, *self.p.new_items, *self.output]

    def _model_items(self) -> list[dict[str, Any]]:
        """The history as the model sees it: built-in tool items in their function-call form, client
        tool calls under the names the model knows them by."""
        if self.tools is None:
            items = self._history_items()
        else:
            items = self.tools.model_items([*self.p.history, *self.p.new_items], self.output)
        return [self.client_tools.upstream_item(item) for item in items]

    async def _run_round(self) -> AsyncIterator[Event]:
        chat = self.config.upstream_api == "chat_completions"
        body = self._chat_body() if chat else self._responses_body()
        path = "/v1/chat/completions" if chat else "/v1/responses"
        headers = dict(self.p.headers)
        headers["content-type"] = "application/json"
        headers["accept"] = "text/event-stream"
        try:
            response = await self.upstream.send("POST", path, body=orjson.dumps(body), headers=headers)
        except errors.GatewayError as exc:
            raise StreamFailure(exc.message, status=exc.status) from None
        try:
            if response.status != 200:
                await self._raise_upstream_status(response)
            limit = self.config.responses.max_upstream_sse_line_bytes
            self._round_status = "completed"
            self._round_tier = None
            self._round_streamed = False
            terminal_seen = False
            try:
                async for name, data in read_sse(response, limit):
                    if chat:
                        if data == b"[DONE]":
                            terminal_seen = True
                            break
                        for event in self._on_chat_chunk(data):
                            yield event
                    else:
                        events, terminal_seen = self._on_responses_event(name, data)
                        for event in events:
                            yield event
                        if terminal_seen:
                            break
            except errors.GatewayError as exc:
                raise StreamFailure(exc.message, status=exc.status) from None
            if not terminal_seen:
                raise StreamFailure("The upstream stream ended before the response was complete.")
            if not response.complete:
                await _drain(response)
        finally:
            await response.aclose()

    async def _raise_upstream_status(self, response: Any) -> None:
        raw = b""
        async for chunk in response:
            raw += chunk
            if len(raw) > _MAX_ERROR_BODY:
                break
        message = f"The upstream model server answered {response.status}."
        try:
            payload = orjson.loads(raw)
            detail = payload.get("error", payload) if isinstance(payload, dict) else None
            if isinstance(detail, dict) and isinstance(detail.get("message"), str):
                message = detail["message"]
            elif isinstance(payload, dict) and isinstance(payload.get("message"), str):
                message = payload["message"]
        except orjson.JSONDecodeError:
            pass
        status = response.status
        if 400 <= status < 500:
            self.http_error = errors.GatewayError(message, status=status, code="upstream_error")
            self.http_error.type = "invalid_request_error"
        else:
            self.http_error = errors.UpstreamError(message)
        raise StreamFailure(message, status=status)

    def _common_forward(self) -> dict[str, Any]:
        """Request fields forwarded on every round (request-scoped ones only when set)."""
        body = {k: v for k, v in self.p.raw.items() if k not in NOT_FORWARDED and k != "input"}
        for key in ("prompt_cache_key", "prompt_cache_retention", "service_tier"):
            if body.get(key) is None:
                body.pop(key, None)
        if self.p.prompt_cache_options is None:
            body.pop("prompt_cache_options", None)
        else:
            body["prompt_cache_options"] = self.p.prompt_cache_options
        return body

    def _responses_body(self) -> dict[str, Any]:
        body = self._common_forward()
        body["input"] = [translate.output_to_input(item) for item in self._model_items()]
        if self.p.request.instructions is None:
            body.pop("instructions", None)
        # Client tools (mapped) plus, while max_tool_calls allows, one function per gateway tool.
        tools = self.client_tools.responses_tools()
        if self.tools is not None:
            tools = [t for t in tools if t.get("type") not in GATEWAY_TOOL_TYPES]
            tools += self.tools.responses_tools(())
        if tools:
            body["tools"] = tools
            body["parallel_tool_calls"] = self.p.request.parallel_tool_calls is True
        else:
            body.pop("tools", None)
            body.pop("parallel_tool_calls", None)
        if "tool_choice" in body:
            choice = self.client_tools.tool_choice(body["tool_choice"])
            body["tool_choice"] = self.tools.tool_choice(choice) if self.tools is not None else choice
        if self.tools is not None and "include" in body:
            include = self.tools.upstream_include(body["include"])
            if include is None:
                body.pop("include")
            else:
                body["include"] = include
        body["store"] = False
        body["stream"] = True
        return body

    def _chat_body(self) -> dict[str, Any]:
        r = self.p.request
        forwarded = self._common_forward()
        body: dict[str, Any] = {"model": r.model}
        body["messages"] = translate.items_to_messages(r.instructions, self._model_items())
        tools = self.client_tools.chat_tools()
        tool_choice = self.client_tools.tool_choice(r.tool_choice)
        if self.tools is not None:
            tools += self.tools.chat_tools()
            tool_choice = self.tools.tool_choice(tool_choice)
        if tools:
            body["tools"] = tools
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
        skip = {
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
        for key, value in forwarded.items():
            if key not in skip:
                body[key] = value
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        return body

    # --- upstream /v1/responses events ---------------------------------------------------------

    def _on_responses_event(self, name: str | None, data: bytes) -> tuple[list[Event], bool]:
        kind, event = upstream_events.responses_event(name, data)
        index = event.get("output_index")
        key = ("r", self._round, index)
        out: list[Event] = []
        if kind in upstream_events.STREAMED_OUTPUT:
            self._round_streamed = True
        if kind == "response.output_item.added":
            item = event["item"]
            itype = item.get("type")
            if itype in ("message", "reasoning"):
                out += self._ensure(key, itype)
            elif itype in ("function_call", "custom_tool_call"):
                out += self._ensure(key, itype, call_id=item.get("call_id"), name=item.get("name"))
        elif kind == "response.output_text.delta":
            out += self._text(key, _str(event.get("delta")))
        elif kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            out += self._reasoning(key, _str(event.get("delta")))
        elif kind in ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta"):
            out += self._call_delta(key, _str(event.get("delta")))
        elif kind == "response.output_item.done":
            out += self._item_done(key, event["item"])
        elif kind in ("response.completed", "response.incomplete"):
            response = event["response"]
            out += self._close()
            if not self._round_streamed:
                # An upstream that sends its output only in the terminal event: taken from there.
                for position, item in enumerate(response.get("output") or ()):
                    out += self._item_done(("r", self._round, "terminal", position), item)
                out += self._close()
            self._take_usage_responses(response.get("usage"))
            tier = response.get("service_tier")
            self._round_tier = tier if isinstance(tier, str) else None
            # vLLM ends a length-capped response with ``response.completed`` whose status says
            # ``incomplete``: the status field decides, not only the event name.
            if kind == "response.incomplete" or response.get("status") == "incomplete":
                self._round_status = "incomplete"
                self.incomplete_details = response.get("incomplete_details") or {
                    "reason": "max_output_tokens"
                }
            return out, True
        elif kind == "response.failed":
            error = (event.get("response") or {}).get("error") or {}
            raise StreamFailure(error.get("message") or "The upstream response failed.")
        elif kind == "error":
            raise StreamFailure(_str(event.get("message")) or "The upstream stream reported an error.")
        return out, False

    def _item_done(self, key: Any, item: dict[str, Any]) -> list[Event]:
        out: list[Event] = []
        itype = item.get("type")
        if self.open is not None and self.open.key == key:
            if not self.open.parts:  # the upstream sent the item whole: replay it as one delta
                if itype == "message":
                    text = "".join(
                        p.get("text", "") for p in item.get("content") or () if isinstance(p, dict)
                    )
                    if text:
                        out += self._text(key, text)
                elif itype == "reasoning":
                    text = "".join(
                        p.get("text", "") for p in item.get("content") or () if isinstance(p, dict)
                    )
                    if text:
                        out += self._reasoning(key, text)
                elif itype == "function_call" and item.get("arguments"):
                    out += self._call_delta(key, _str(item.get("arguments")))
                elif itype == "custom_tool_call" and item.get("input"):
                    out += self._call_delta(key, _str(item.get("input")))
            out += self._close()
        elif key not in self.closed_keys and isinstance(itype, str):
            if itype in ("message", "reasoning", "function_call", "custom_tool_call"):
                out += self._ensure(key, itype, call_id=item.get("call_id"), name=item.get("name"))
                return out + self._item_done(key, item)
            out += self._close()
            whole = dict(item)
            whole["id"] = new_id("item")
            out += self._whole(whole)
            self.closed_keys.add(key)
        return out

    def _take_usage_responses(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        self.usage.add(
            input_tokens=usage.get("input_tokens"),
            output_tokens=usage.get("output_tokens"),
            total=usage.get("total_tokens"),
            input_details=usage.get("input_tokens_details"),
            output_details=usage.get("output_tokens_details"),
        )

    # --- upstream /v1/chat/completions chunks --------------------------------------------------

    def _on_chat_chunk(self, data: bytes) -> list[Event]:
        chunk = upstream_events.chat_chunk(data)
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else None
            raise StreamFailure(_str(message) or "The upstream stream reported an error.")
        out: list[Event] = []
        if isinstance(chunk.get("service_tier"), str):
            self._round_tier = chunk["service_tier"]
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
                out += self._reasoning(("c", self._round, "reasoning"), _str(reasoning))
            if delta.get("content"):
                out += self._text(("c", self._round, "text"), _str(delta["content"]))
            for call in delta.get("tool_calls") or ():
                key = ("c", self._round, "tool", call.get("index", 0))
                function = call.get("function") or {}
                if (self.open is None or self.open.key != key) and key not in self.closed_keys:
                    name = _str(function.get("name"))
                    out += self._ensure(
                        key, "function_call", call_id=call.get("id") or new_id("call"), name=name
                    )
                if function.get("arguments"):
                    out += self._call_delta(key, _str(function["arguments"]))
            finish = choice.get("finish_reason")
            if finish == "length":
                self._round_status = "incomplete"
                self.incomplete_details = {"reason": "max_output_tokens"}
            elif finish == "content_filter":
                self._round_status = "incomplete"
                self.incomplete_details = {"reason": "content_filter"}
        return out

    # --- output items and their events ---------------------------------------------------------

    def _retain(self, size: int) -> None:
        self.retained += size
        limit = self.config.responses.max_retained_bytes
        if self.retained > limit:
            raise StreamFailure(
                f"The response exceeded max_retained_bytes ({limit} bytes) of retained state."
            )

    def _ensure(self, key: Any, kind: str, *, call_id: Any = None, name: Any = None) -> list[Event]:
        if self.open is not None and self.open.key == key:
            return []
        out = self._close()
        if kind == "function_call" and self.tools is not None and self.tools.is_gateway(_str(name)):
            # A gateway tool call: buffered whole; the tool loop emits the public item when it closes.
            self.open = _Open(
                key,
                kind,
                {"type": "function_call", "call_id": _str(call_id), "name": _str(name)},
                -1,
                hidden=True,
            )
            return out
        index = len(self.output)
        # The upstream calls the flat function; the client gets back the tool it declared.
        restored = self.client_tools.restore(_str(name)) if kind == "function_call" else None
        namespace = None
        if restored is not None and restored.kind in translate.WHOLE_CALLS:
            # A shell or tool_search call: buffered whole, then streamed as its public item.
            public = translate.WHOLE_CALLS[restored.kind][0]
            self.open = _Open(key, public, {"call_id": _str(call_id)}, -1, buffered=True)
            return out
        if restored is not None:
            name, namespace = restored.name, restored.namespace
            if restored.kind == "custom":
                kind = "custom_tool_call"
        item_id = translate.mint_item_id(kind)
        item: dict[str, Any]
        if kind == "message":
            item = {
                "id": item_id,
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
        elif kind == "reasoning":
            item = {"id": item_id, "type": "reasoning", "summary": []}
        elif kind == "custom_tool_call":
            item = {
                "id": item_id,
                "type": "custom_tool_call",
                "status": "in_progress",
                "call_id": _str(call_id),
                "name": _str(name),
                "input": "",
            }
            if namespace is not None:
                item["namespace"] = namespace
        else:
            item = {
                "id": item_id,
                "type": "function_call",
                "status": "in_progress",
                "call_id": _str(call_id),
                "name": _str(name),
                "arguments": "",
            }
            if namespace is not None:
                item["namespace"] = namespace
        self.open = _Open(key, kind, item, index)
        if kind == "custom_tool_call" and restored is not None:
            # The upstream writes {"input": "…"} as function arguments: decoded when complete.
            self.open.buffered = True
        out.append(self.sink.make("response.output_item.added", output_index=index, item=item))
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self._part_event("response.content_part.added", part))
        elif kind == "reasoning":
            out.append(
                self._part_event("response.content_part.added", {"type": "reasoning_text", "text": ""})
            )
        return out

    def _part_event(self, type_: str, part: dict[str, Any]) -> Event:
        assert self.open is not None
        return self.sink.make(
            type_, item_id=self.open.item["id"], output_index=self.open.index, content_index=0, part=part
        )

    def _text(self, key: Any, delta: str) -> list[Event]:
        out = self._ensure(key, "message")
        assert self.open is not None
        self._retain(len(delta))
        self.open.parts.append(delta)
        out.append(
            self.sink.make(
                "response.output_text.delta",
                item_id=self.open.item["id"],
                output_index=self.open.index,
                content_index=0,
                delta=delta,
                logprobs=[],
            )
        )
        return out

    def _reasoning(self, key: Any, delta: str) -> list[Event]:
        out = self._ensure(key, "reasoning")
        assert self.open is not None
        self._retain(len(delta))
        self.open.parts.append(delta)
        out.append(
            self.sink.make(
                "response.reasoning_text.delta",
                item_id=self.open.item["id"],
                output_index=self.open.index,
                content_index=0,
                delta=delta,
            )
        )
        return out

    def _call_delta(self, key: Any, delta: str) -> list[Event]:
        if self.open is None or self.open.key != key:
            if key in self.closed_keys:
                return []  # a late fragment of a finished call cannot be streamed any more
            out = self._ensure(key, "function_call", call_id=new_id("call"), name="")
        else:
            out = []
        assert self.open is not None
        self._retain(len(delta))
        self.open.parts.append(delta)
        if self.open.buffered or self.open.hidden:
            return out
        type_ = (
            "response.custom_tool_call_input.delta"
            if self.open.kind == "custom_tool_call"
            else "response.function_call_arguments.delta"
        )
        out.append(
            self.sink.make(type_, item_id=self.open.item["id"], output_index=self.open.index, delta=delta)
        )
        return out

    def _close(self) -> list[Event]:
        current, self.open = self.open, None
        if current is None:
            return []
        self.closed_keys.add(current.key)
        sink = self.sink
        item = dict(current.item)
        text = "".join(current.parts)
        if current.hidden:
            assert self.tools is not None
            return self.tools.on_gateway_call(self, item["call_id"], item["name"], text)
        whole = _WHOLE_ITEMS.get(current.kind)
        if whole is not None:
            self._round_client_calls += 1
            return self._whole(whole(translate.mint_item_id(current.kind), item["call_id"], text))
        if current.kind in ("function_call", "custom_tool_call"):
            self._round_client_calls += 1
        item_id, index = item["id"], current.index
        out: list[Event] = []
        self.open = current  # _part_event reads the open item
        if current.kind == "message":
            out.append(
                sink.make(
                    "response.output_text.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
            )
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            out.append(self._part_event("response.content_part.done", part))
            item["status"] = "completed"
            item["content"] = [part]
        elif current.kind == "reasoning":
            out.append(
                sink.make(
                    "response.reasoning_text.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    text=text,
                )
            )
            out.append(
                self._part_event("response.content_part.done", {"type": "reasoning_text", "text": text})
            )
            item["content"] = [{"type": "reasoning_text", "text": text}]
        elif current.kind == "custom_tool_call":
            if current.buffered:
                text = _custom_input(text)
                if text:
                    out.append(
                        sink.make(
                            "response.custom_tool_call_input.delta",
                            item_id=item_id,
                            output_index=index,
                            delta=text,
                        )
                    )
            out.append(
                sink.make(
                    "response.custom_tool_call_input.done", item_id=item_id, output_index=index, input=text
                )
            )
            item["status"] = "completed"
            item["input"] = text
        else:
            out.append(
                sink.make(
                    "response.function_call_arguments.done",
                    item_id=item_id,
                    output_index=index,
                    arguments=text,
                )
            )
            item["status"] = "completed"
            item["arguments"] = text
        self.open = None
        self._retain(len(orjson.dumps(item)) - len(text))
        out.append(sink.make("response.output_item.done", output_index=index, item=item))
        self.output.append(item)
        return out

    def _whole(self, item: dict[str, Any]) -> list[Event]:
        index = len(self.output)
        self._retain(len(orjson.dumps(item)))
        out = [
            self.sink.make("response.output_item.added", output_index=index, item=item),
            self.sink.make("response.output_item.done", output_index=index, item=item),
        ]
        self.output.append(item)
        return out


async def _drain(response: Any, limit: int = 64 * 1024, timeout: float = 1.0) -> None:
    """Read what follows the terminal event (``[DONE]``, the chunked end) so the pooled upstream
    connection is handed back for reuse instead of being closed; bounded in bytes and time. Not
    called when the body has already arrived whole (the usual case: an upstream sends its last
    event and the chunked end together), where closing it hands the connection back at once."""
    seen = 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in response:
                seen += len(chunk)
                if seen > limit:
                    return
    except (TimeoutError, errors.GatewayError):
        return


# The public item type of a client call buffered whole → the builder of that item.
_WHOLE_ITEMS = dict(translate.WHOLE_CALLS.values())


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


def _custom_input(arguments: str) -> str:
    """A custom tool rendered as a chat function takes ``{"input": "…"}``; unwrap it."""
    try:
        decoded = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(decoded, dict) and isinstance(decoded.get("input"), str):
        return decoded["input"]
    return arguments
