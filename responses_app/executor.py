"""The executor: the round loop of one response against the upstream, and its storage.

One response runs as rounds: send the whole history and the tools upstream (``/v1/responses`` or
``/v1/chat/completions``, by ``upstream_api``), read the upstream stream, and emit our own events
with our own item ids. When the model calls client tools (function, custom) the response ends
with those calls for the client to run; gateway-executed tools (web search, code interpreter, MCP)
run between rounds and the loop goes on, at most ``max_rounds`` times (``responses_app.tool_loop``).

The jobs around the loop live beside it:

* ``responses_app.wire``: the request body of a round in either upstream format, the upstream's
  error answer;
* ``responses_app.parsers``: the two upstream stream formats, read into emitter calls;
* ``responses_app.emitter``: our public output items and their events, under the retained budget;
* ``responses_app.domain``: the types they share (``Prepared``, ``Usage``, ``RoundState``, …).

The seams of the loop (:meth:`Executor._run`): :meth:`Executor._before_round` runs before every
inference round, :meth:`Executor._continues` decides whether another round follows.

Nothing fake is ever sent: a truncated or malformed upstream stream, an oversize SSE line or an
upstream error ends the response ``failed`` (stored as failed when ``store``), and the terminal
snapshot is written *before* the terminal event, so a write failure reaches the client as an
``error`` event instead of ``response.completed``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from gateway import errors
from gateway.config import Config
from gateway.logging import request_id_var
from responses_app import async_tools, compaction, parsers, services, translate, wire
from responses_app.domain import TERMINAL_EVENT, Prepared, RoundState, Usage, base_snapshot
from responses_app.echo import tool_usage
from responses_app.emitter import Emitter
from responses_app.events import Event, EventSink, EventTooLarge, StreamFailure, error_frame, read_sse
from responses_app.tool_loop import ROUND_CAP_REASON, ToolLoop, web_search_available

log = logging.getLogger("responses.executor")


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
        # Client tools as the model sees them (namespaces flattened, custom tools as functions).
        self.client_tools = prepared.tool_map or translate.ToolMap.build(
            prepared.request.tools, search_available=web_search_available(config)
        )
        self.emitter = Emitter(
            self.sink, self.client_tools, max_retained_bytes=config.responses.max_retained_bytes
        )
        self.usage = Usage()
        self.service_tier: str | None = None
        self.error: dict[str, Any] | None = None
        self.incomplete_details: dict[str, Any] | None = None
        self.http_error: errors.GatewayError | None = None
        self.final: dict[str, Any] | None = None  # the terminal snapshot once sent
        self.failure_event: Event | None = None  # the error event, when one ended the stream
        self.stored = False
        self.store_refusal: errors.GatewayError | None = None  # set when storing was refused
        self.round: RoundState | None = None  # the round running or last run
        self._finishing = False  # _finish has begun: an error there ends with an ``error`` event
        # Background runs flush their persisted events here, before the terminal snapshot is written.
        self.before_store: Any = None
        # A stored stream writes its ``in_progress`` row here, before response.created (runs.drive).
        self.before_start: Any = None
        self.initial_status = "queued" if prepared.background else "in_progress"
        self.tools: ToolLoop | None = None  # gateway tools, set by prepare_tools (before the response starts)
        # Automatic compaction and the compaction_trigger (responses_app.compaction).
        self.compactor = compaction.Compactor(prepared)
        # WebSocket steering (responses_app.steering): asked at each safe boundary whether accepted
        # steering waits; when it does, the response ends ``incomplete`` / ``steered`` there.
        self.steer_requested: Callable[[], bool] | None = None
        self._base: dict[str, Any] | None = None
        self.async_rounds = async_tools.AsyncRounds()  # async-only rounds in a row (the stop rule)

    @property
    def output(self) -> list[dict[str, Any]]:
        """The response's output items so far."""
        return self.emitter.output

    async def prepare_tools(self) -> None:
        """Classify tools, validate, discover MCP tools: every refusal is a 400 before any byte."""
        if self.tools is None:
            self.tools = await ToolLoop.prepare(self.p, self.config)
        self.emitter.tools = self.tools

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
        self.emitter.tools = tools
        if self.before_start is not None:
            await self.before_start()
        try:
            yield self.sink.make("response.created", response=self.snapshot(self.initial_status))
            yield self.sink.make("response.in_progress", response=self.snapshot("in_progress"))
            for event in tools.listing_events(self.emitter):
                yield event
            async for event in tools.run_approvals(self.emitter):
                yield event
            for number in range(1, self.config.responses.max_rounds + 1):
                async for event in self._before_round():
                    yield event
                if self.compactor.ends_response:
                    break  # a compaction_trigger response is its compaction item
                self.round = RoundState(number)
                self.emitter.start_round()
                tools.start_round()
                async for event in self._run_round(self.round):
                    yield event
                for event in self.emitter.close():
                    yield event
                status = self.round.status
                self.service_tier = self.round.tier
                # Gateway calls run even when the round also ends the response (client calls,
                # approval requests, an incomplete round, steering): they are recorded either way.
                async for event in tools.execute_round(self.emitter):
                    yield event
                for event in self.emitter.flush_deferred():  # async calls held behind them
                    yield event
                if self.round.steered:
                    status = self._steered()
                    break
                if not self._continues(status):
                    break
                if self._steer_waiting():  # a round boundary: the round's gateway calls settled
                    status = self._steered()
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

    async def _before_round(self) -> AsyncIterator[Event]:
        """The hook before every inference round (the history is final for the round here):
        compaction, when the request's threshold or its compaction_trigger asks for it."""
        async for event in self.compactor.before_round(self):
            yield event

    def _continues(self, status: str) -> bool:
        """Whether another round follows this one: only after a completed round without synchronous
        client calls and without a call that ends the response (e.g. an approval), when it ran
        gateway calls or its only client calls were async (at most two such rounds in a row)."""
        assert self.tools is not None
        emitter = self.emitter
        async_more = self.async_rounds.after_round(
            async_calls=emitter.async_calls, sync_calls=emitter.sync_calls
        )
        if (
            status != "completed"
            or emitter.sync_calls
            or self.tools.ends_response
            or self.async_rounds.exhausted
        ):
            return False
        return bool(self.tools.round_calls) or async_more

    def _steer_waiting(self) -> bool:
        return self.steer_requested is not None and self.steer_requested()

    def _steered(self) -> str:
        """Stop for steering: earlier output is kept; the response ends incomplete, ``steered``."""
        self.incomplete_details = {"reason": "steered"}
        return "incomplete"

    async def interrupt(self, message: str) -> AsyncIterator[Event]:
        """End a run that was stopped from outside (the shutdown deadline) as ``failed``: the
        terminal event, and the stored row when it stores. Nothing when it had already ended."""
        if self.final is not None or self.failure_event is not None:
            return
        async for event in self._end_unexpected(message):
            yield event

    def _fail(self, message: str, code: str, status: int | None) -> None:
        self.emitter.drop_open()  # an unfinished item is not part of a failed response
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
                self.emitter.output = []
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
        self.emitter.drop_open()
        self.error = {"code": "server_error", "message": message}
        try:
            await self._store("failed", self.snapshot("failed"))
        except Exception:
            log.exception("storing failed response %s failed", self.p.response_id)

    async def _store(
        self, status: str, snapshot: dict[str, Any], terminal: tuple[int, bytes] | None = None
    ) -> None:
        output_items = self.tools.stored_items(self.output) if self.tools else self.output
        outcome = services.Outcome(
            status,
            snapshot,
            output_items,
            self.usage.as_dict(),
            self.error,
            terminal,
            window=self.checkpoint(output_items) if self.compactor.compacted else None,
        )
        self.stored = await services.final_writes.run(
            services.response_store_final, prepared=self.p, outcome=outcome
        )

    # --- one upstream round --------------------------------------------------------------------

    def checkpoint(self, output: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The history a continuation of this response starts from: history, input and output, or
        after a compaction the window (the user's messages, the compaction item, what followed)."""
        return self.compactor.checkpoint(
            [*self.p.history, *self.p.new_items], self.output if output is None else output
        )

    def model_items(self) -> list[dict[str, Any]]:
        """The history as the model sees it: built-in tool items in their function-call form, client
        tool calls under the names the model knows them by, a compaction as its summary."""
        if self.tools is None:
            items = [*self.p.history, *self.p.new_items, *self.output]
        else:
            items = self.tools.model_items([*self.p.history, *self.p.new_items], self.output)
        return [self.client_tools.upstream_item(item) for item in self.compactor.window(items)]

    async def _run_round(self, state: RoundState) -> AsyncIterator[Event]:
        chat = self.config.upstream_api == "chat_completions"
        build, path = (wire.chat_body, wire.CHAT_PATH) if chat else (wire.responses_body, wire.RESPONSES_PATH)
        body = build(self.p, self.client_tools, self.tools, self.model_items())
        headers = dict(self.p.headers)
        headers["content-type"] = "application/json"
        headers["accept"] = "text/event-stream"
        try:
            response = await self.upstream.send("POST", path, body=orjson.dumps(body), headers=headers)
        except errors.GatewayError as exc:
            raise StreamFailure(exc.message, status=exc.status) from None
        try:
            if response.status != 200:
                self.http_error = await wire.status_error(response)
                raise StreamFailure(self.http_error.message, status=response.status)
            parser = parsers.for_round(chat, self.emitter, state, self.usage)
            limit = self.config.responses.max_upstream_sse_line_bytes
            terminal_seen = False
            try:
                async for name, data in read_sse(response, limit):
                    events, terminal_seen = parser.feed(name, data)
                    for event in events:
                        yield event
                    if terminal_seen:
                        break
                    # Only a complete item lifecycle event establishes that started work settled
                    # (chat completions has none: its rounds stop at their end).
                    if state.settled and self._steer_waiting():
                        state.steered = True
                        break
            except errors.GatewayError as exc:
                raise StreamFailure(exc.message, status=exc.status) from None
            if state.steered:
                return  # the upstream request is closed below; its remaining output is dropped
            if not terminal_seen:
                raise StreamFailure("The upstream stream ended before the response was complete.")
            if not response.complete:
                await wire.drain(response)
        finally:
            if state.incomplete_details is not None:
                self.incomplete_details = state.incomplete_details
            await response.aclose()
