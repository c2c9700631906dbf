"""The executor: the round loop of one response against the upstream, and its storage.

One response runs as rounds: send the whole history and the tools upstream (``/v1/responses`` or
``/v1/chat/completions``, by ``upstream_api``), read the upstream stream, and emit our own events
with our own item ids. When the model calls client tools (function, custom) the response ends
with those calls for the client to run; gateway-executed tools (web search, code interpreter, MCP)
run between rounds and the loop goes on, at most ``max_rounds`` times (``responses_app.tool_loop``).

The jobs around the loop live in their own modules, each with a public interface:

* ``responses_app.wire``: the request body of a round in either upstream format, sending it, the
  upstream's error answer;
* ``responses_app.parsers``: the two upstream stream formats, read into emitter calls;
* ``responses_app.emitter``: our public output items and their events, under the retained budget;
* ``responses_app.compaction`` (the hook before every round), ``responses_app.async_tools`` (the
  stop rule), ``responses_app.steering`` (the safe boundaries);
* ``responses_app.domain``: the types they share (``Prepared``, ``Usage``, ``RoundState``, …).

Extension seams (``responses_app.multi_agent.Coordinator`` uses them): :meth:`Executor.rounds` is
the work between ``response.in_progress`` and the terminal event (it sets ``end_status``),
:meth:`Executor.settle` runs before the terminal snapshot, :meth:`Executor.store` writes the
outcome, and :meth:`Executor.run_round` runs one inference round over :meth:`Executor.model_items`.

Nothing fake is ever sent: a truncated or malformed upstream stream, an oversize SSE line or an
upstream error ends the response ``failed`` (stored as failed when ``store``), and the terminal
snapshot is written *before* the terminal event, so a write failure reaches the client as an
``error`` event instead of ``response.completed``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from gateway import errors
from gateway.config import Config
from gateway.db import run_orm
from gateway.logging import request_id_var
from responses_app import async_tools, compaction, parsers, services, steering, translate, wire
from responses_app.domain import TERMINAL_EVENT, Prepared, RoundState, Usage, base_snapshot, snapshot
from responses_app.emitter import Emitter
from responses_app.events import Event, EventSink, EventTooLarge, StreamFailure, error_frame
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
        # WebSocket steering: the consumer sets ``steer.requested``; the response stops at a boundary.
        self.steer = steering.Boundary()
        self._base: dict[str, Any] | None = None
        self.async_rounds = async_tools.AsyncRounds()  # async-only rounds in a row (the stop rule)
        self.end_status = "completed"  # how the rounds ended (set by ``rounds``)

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
        """The response object now, with ``status``."""
        if self._base is None:  # the request's part, built once per response
            self._base = base_snapshot(self.p, status)
        return snapshot(
            self._base,
            status,
            self.output,
            self.usage,
            service_tier=self.service_tier,
            error=self.error,
            incomplete_details=self.incomplete_details,
        )

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
            if self.ended:
                log.exception("response %s failed after its terminal event", self.p.response_id)
                return
            log.exception(
                "response %s failed unexpectedly (request %s); ending it failed",
                self.p.response_id,
                request_id_var.get(),
            )
            async for event in self.interrupt("The gateway failed while generating this response."):
                yield event

    @property
    def ended(self) -> bool:
        """Whether the terminal event (or the error event that replaced it) was made."""
        return self.final is not None or self.failure_event is not None

    async def interrupt(self, message: str) -> AsyncIterator[Event]:
        """End a run that stopped unexpectedly or from outside (the shutdown deadline) as ``failed``:
        the terminal event, and the stored row when it stores. Nothing when it had already ended."""
        if self.ended:
            return
        if self.sink.sequence_number and not self._finishing:
            self._fail(StreamFailure(message))
            try:
                async for event in self._finish("failed"):
                    yield event
                return
            except Exception:
                log.exception("ending response %s failed", self.p.response_id)
                if self.ended:
                    return
        async for event in self._end_with_error("server_error", message):
            yield event

    async def _run(self) -> AsyncIterator[Event]:
        if self.tools is None:
            try:
                await self.prepare_tools()
            except errors.GatewayError as exc:  # callers that did not prepare (WebSocket, background)
                if self.p.background:  # its row exists: it must not stay in progress
                    self.error = {"code": exc.code or "server_error", "message": exc.message}
                    await self.store("failed", self.snapshot("failed"))
                self.failure_event = error_frame(
                    code=exc.code, message=exc.message, param=exc.param, sequence_number=0
                )
                yield self.failure_event
                return
        self.emitter.tools = self.tools
        if self.before_start is not None:
            await self.before_start()
        try:
            yield self.sink.make("response.created", response=self.snapshot(self.initial_status))
            yield self.sink.make("response.in_progress", response=self.snapshot("in_progress"))
            async with contextlib.aclosing(self.rounds()) as events:
                async for event in events:
                    yield event
            status = self.end_status
        except StreamFailure as failure:
            status = "failed"
            self._fail(failure)
        except EventTooLarge as exc:
            async for event in self._end_with_error("event_too_large", exc.message):
                yield event
            return
        self.settle()
        async for event in self._finish(status):
            yield event

    async def rounds(self) -> AsyncGenerator[Event, None]:
        """The response's work between ``response.in_progress`` and its terminal event, a seam:
        the tool listings and approvals, then the inference rounds. Sets :attr:`end_status`; an
        upstream failure raises :class:`StreamFailure`."""
        tools = self.tools
        assert tools is not None
        for event in tools.listing_events(self.emitter):
            yield event
        async for event in tools.run_approvals(self.emitter):
            yield event
        for number in range(1, self.config.responses.max_rounds + 1):
            async for event in self.compactor.before_round(self):  # the history is final here
                yield event
            if self.compactor.ends_response:
                return  # a compaction_trigger response is its compaction item
            self.round = RoundState(number)
            self.emitter.start_round()
            tools.start_round()
            async for event in self.run_round(self.round):
                yield event
            for event in self.emitter.close():
                yield event
            self.end_status = self.round.status
            self.service_tier = self.round.tier
            # Gateway calls run even when the round also ends the response (client calls,
            # approval requests, an incomplete round, steering): they are recorded either way.
            async for event in tools.execute_round(self.emitter):
                yield event
            for event in self.emitter.flush_deferred():  # async calls held behind them
                yield event
            if self.round.steered:
                break
            if not self.async_rounds.next_round(
                completed=self.end_status == "completed",
                sync_calls=self.emitter.sync_calls,
                async_calls=self.emitter.async_calls,
                gateway_calls=bool(tools.round_calls),
                ends_response=tools.ends_response,
            ):
                return
            if self.steer.waiting():  # a round boundary: the round's gateway calls settled
                break
        else:
            self.end_status = "incomplete"  # every round ended in gateway calls
            self.incomplete_details = {"reason": ROUND_CAP_REASON}
            return
        self.end_status = "incomplete"  # stopped for steering: the earlier output is kept
        self.incomplete_details = steering.steered_details()

    def settle(self) -> None:
        """A seam: runs once the rounds ended (failed included), before the terminal snapshot."""

    def _fail(self, failure: StreamFailure) -> None:
        self.emitter.drop_open()  # an unfinished item is not part of a failed response
        self.error = failure.response_error()

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
                await self.store(status, snapshot, (terminal.data["sequence_number"], terminal.json))
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
            await self.store("failed", self.snapshot("failed"))
        except Exception:
            log.exception("storing failed response %s failed", self.p.response_id)

    async def store(
        self, status: str, snapshot: dict[str, Any], terminal: tuple[int, bytes] | None = None
    ) -> None:
        """Store the response's outcome (a seam): the row, its items, the continuation's window."""
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
        self.stored = await run_orm(services.response_store_final, prepared=self.p, outcome=outcome)

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

    async def run_round(self, state: RoundState) -> AsyncIterator[Event]:
        """One inference round over :meth:`model_items`: the body in the configured wire format,
        the upstream's stream read into our events."""
        chat = self.config.upstream_api == "chat_completions"
        path, body = wire.round_request(chat, self.p, self.client_tools, self.tools, self.model_items())
        response = await wire.send(self.upstream, path, body, self.p.headers)
        try:
            if response.status != 200:
                self.http_error = await wire.status_error(response)
                raise StreamFailure(self.http_error.message, status=response.status)
            parser = parsers.for_round(chat, self.emitter, state, self.usage)
            limit = self.config.responses.max_upstream_sse_line_bytes
            async for event in parsers.read(parser, response, limit, self.steer.waiting):
                yield event
        finally:
            if state.incomplete_details is not None:
                self.incomplete_details = state.incomplete_details
            await response.aclose()
