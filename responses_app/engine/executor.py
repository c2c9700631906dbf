"""The executor: the round loop of one response against the upstream, and its storage.

Each round sends the history and tools upstream, reads the stream and emits our own events and
item ids. Client tool calls end the response; gateway tools run between rounds, at most
``max_rounds`` times (``tool_loop``). The seams :meth:`Executor.rounds`, ``settle``,
:meth:`Executor.store` and :meth:`Executor.run_round` are what the multi-agent ``Coordinator``
overrides.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncGenerator
from typing import Any

from gateway.core import errors, spans
from gateway.core.config import Config
from gateway.core.sse import Event, StreamFailure
from inference_app.upstream import lineage
from inference_app.upstream.http import get_upstream
from responses_app.engine import metering, parsers, translate, wire
from responses_app.engine.domain import Prepared, RoundState
from responses_app.engine.lifecycle import Lifecycle
from responses_app.engine.tool_loop import ROUND_CAP_REASON, ToolLoop, web_search_available
from responses_app.features import async_tools, compaction, steering
from responses_app.protocol.multi_agent_config import single_agent_view
from responses_app.storage import writes
from usage_app import metrics as usage_metrics


class Executor(Lifecycle):
    """One response's rounds against the upstream, and its storage (the events around them, the
    response object and its one end: :class:`~responses_app.engine.lifecycle.Lifecycle`)."""

    def __init__(
        self,
        prepared: Prepared,
        config: Config,
        *,
        upstream: Any = None,
        event_fields: dict[str, Any] | None = None,
    ) -> None:
        # Client tools as the model sees them (namespaces flattened, custom tools as functions).
        self.client_tools = prepared.tool_map or translate.ToolMap.build(
            prepared.request.tools, search_available=web_search_available(config)
        )
        super().__init__(prepared, config, self.client_tools, event_fields=event_fields)
        self.upstream = upstream or get_upstream()
        self.http_error: errors.GatewayError | None = None  # the upstream's refusal, relayed when 4xx
        self.stored = False
        self.round: RoundState | None = None  # the round running or last run
        self.tools: ToolLoop | None = None  # gateway tools, set by prepare_tools (before the response starts)
        # Automatic compaction and the compaction_trigger (responses_app.features.compaction).
        self.compactor = compaction.Compactor(prepared)
        # WebSocket steering: the consumer sets ``steer.requested``; the response stops at a boundary.
        self.steer = steering.Boundary()
        self.async_rounds = async_tools.AsyncRounds()  # async-only rounds in a row (the stop rule)
        # The usage ledger's rows of this response's upstream calls (a multi-agent response's agents
        # share their coordinator's).
        self.meter = metering.Meter(prepared)
        # False: nobody reads this response's events as they come (a JSON client), so each round
        # asks the upstream for one answer instead of a stream (``run_round``).
        self.stream_rounds = True
        # The lineage every model round of this response (and its compaction summaries) is sent in:
        # the response's, or a multi-agent agent's own (``features.multi_agent.AgentExecutor``).
        self.lineage = prepared.lineage

    async def prepare_tools(self) -> None:
        """Classify tools, validate, discover MCP tools: every refusal is a 400 before any byte."""
        if self.tools is None:
            self.tools = await ToolLoop.prepare(self.p, self.config)
        self.emitter.tools = self.tools

    # --- the rounds ----------------------------------------------------------------------------

    async def rounds(self) -> AsyncGenerator[Event, None]:
        """The tool listings and approvals, then the inference rounds; sets :attr:`end_status`."""
        tools = self.tools
        assert tools is not None
        if not self.compactor.trigger:  # a compaction_trigger response is its one compaction item
            for event in tools.listing_events(self.emitter):
                yield event
        # Each hook (an async generator) is entered only when it has work, saving its set-up per round.
        if tools.has_boundary_work():
            async for event in tools.run_approvals(self.emitter):
                yield event
        for number in range(1, self.config.responses.max_rounds + 1):
            if self.compactor.may_compact():
                async for event in self.compactor.before_round(self):  # the history is final here
                    yield event
            if self.compactor.ends_response:
                return  # a compaction_trigger response is its compaction item
            self.round = RoundState(number)
            self.emitter.start_round()
            tools.start_round()
            # Closed with the response's run (its upstream call ends and is accounted then).
            async with contextlib.aclosing(self.run_round(self.round)) as round_events:
                async for event in round_events:
                    yield event
            for event in self.emitter.close():
                yield event
            self.end_status = self.round.status
            self.service_tier = self.round.tier
            # Gateway calls run even when the round also ends the response (client calls,
            # approval requests, an incomplete round, steering): they are recorded either way.
            if tools.has_boundary_work():
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

    # --- storage -------------------------------------------------------------------------------

    async def store(
        self, status: str, snapshot: dict[str, Any], terminal: tuple[int, bytes] | None = None
    ) -> None:
        """The row, its items, and after a compaction the window a continuation starts from."""
        output_items = self.tools.stored_items(self.output) if self.tools else self.output
        outcome = writes.Outcome(
            status,
            snapshot,
            output_items,
            self.usage.as_dict(),
            self.error,
            terminal,
            window=self.checkpoint(output_items) if self.compactor.compacted else None,
        )
        await self.store_outcome(outcome)

    async def store_outcome(self, outcome: writes.Outcome) -> None:
        """Store ``outcome`` with the ledger rows of this response's calls, in one transaction."""
        outcome = dataclasses.replace(outcome, usage_entries=self.meter.take())
        try:
            with spans.internal(
                "store response",
                **{"gateway.response.id": self.p.response_id, "gateway.response.status": outcome.status},
            ):
                self.stored = await writes.store_final(self.p, outcome)
        except asyncio.CancelledError:
            raise  # the write goes on without its caller: it stores the rows or queues them
        except BaseException:
            self.meter.unwritten(outcome.usage_entries)  # rolled back: the batch writer writes them
            raise

    def run_ended(self) -> None:
        self.meter.settle()

    # --- one upstream round ---------------------------------------------------------------------

    def checkpoint(self, output: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The history a continuation of this response starts from: history, input and output, or
        after a compaction the window (the user's messages, the compaction item, what followed)."""
        return self.compactor.checkpoint(
            [*self.p.history, *self.p.new_items], self.output if output is None else output
        )

    def model_items(self) -> list[dict[str, Any]]:
        """The history as the model sees it: built-in tools as function calls, client calls under their
        model names, a compaction as its summary, a multi-agent turn as the root's items."""
        prior = single_agent_view([*self.p.history, *self.p.new_items])  # no multi-agent items raw
        if self.tools is None:
            items = [*prior, *self.output]
        else:
            items = self.tools.model_items(prior, self.output)
        return [self.client_tools.upstream_item(item) for item in self.compactor.window(items)]

    async def run_round(self, state: RoundState) -> AsyncGenerator[Event, None]:
        """One inference round over :meth:`model_items`: the upstream's stream (or, with
        :attr:`stream_rounds` off, its one answer) read into our events. Its span (``chat {model}``)
        is the current one only while the request is sent: the aiohttp or Celery span is its child."""
        chat = self.config.upstream_api == "chat_completions"
        model_items = self.model_items()
        path, body = wire.round_request(
            chat, self.p, self.client_tools, self.tools, model_items, self.stream_rounds
        )
        span = spans.ModelRound(self.p.request.model or "")
        output_from = len(self.output)
        call = self.meter.start()
        before = metering.Reading.of(self.usage)
        status = 200
        first_token: float | None = None
        read_at: float | None = None
        tokens = metering.NO_TOKENS
        try:
            with lineage.bind(self.lineage), spans.current(span.span):
                response = await wire.send(self.upstream, path, body, self.p.headers)
            call.received = status = response.status
            try:
                if response.status != 200:
                    self.http_error = await wire.status_error(response)
                    raise StreamFailure(self.http_error.message, status=response.status)
                parser = parsers.for_round(chat, self.emitter, state, self.usage)
                limit = self.config.responses.max_upstream_sse_line_bytes
                if not self.stream_rounds and response.content_type != "text/event-stream":
                    events = await parsers.read_whole(parser, response, limit)
                    if not self.sink.unread:  # nobody reads a JSON client's events: made, not passed on
                        for event in events:
                            yield event
                    return
                async for event in parsers.read(parser, response, limit, self.steer.waiting):
                    if first_token is None and event.type.endswith(".delta"):
                        first_token = time.perf_counter()
                    yield event
                read_at = time.perf_counter()
            finally:
                if state.incomplete_details is not None:
                    self.incomplete_details = state.incomplete_details
                await response.aclose()
        except BaseException as exc:
            status = metering.failed_status(exc, call.received)
            spans.ended_by(span.span, exc)
            if call.received not in (None, 200) and span.recording:
                span.span.set_attribute("http.response.status_code", status)
            raise
        finally:
            # One ledger row per upstream call, with the tokens this round reported.
            tokens = metering.Reading.of(self.usage).since(before)
            self.meter.end(call, status, tokens)
            if span.recording:
                self._round_span_ends(span, state, tokens, model_items, output_from)
            span.end()
        if first_token is not None and read_at is not None:
            usage_metrics.observe_stream(
                self.meter.model, first_token - call.started, read_at - first_token, tokens[1]
            )

    def _round_span_ends(
        self,
        span: spans.ModelRound,
        state: RoundState,
        tokens: metering.Tokens,
        model_items: list[dict[str, Any]],
        output_from: int,
    ) -> None:
        if state.finish_reason is not None:
            reasons = [state.finish_reason]
        elif state.status == "incomplete":
            reasons = [str((state.incomplete_details or {}).get("reason") or "incomplete")]
        elif self.emitter.client_calls or self.emitter.gateway_calls:
            reasons = ["tool_calls"]
        else:
            reasons = ["stop"]
        span.span.set_attribute("gateway.round", state.number)
        span.answered(
            response_id=state.response_id if isinstance(state.response_id, str) else None,
            response_model=state.response_model if isinstance(state.response_model, str) else None,
            finish_reasons=reasons,
            input_tokens=tokens[0],
            output_tokens=tokens[1],
        )
        if spans.capture_content():
            produced = self.output[output_from:]
            held = self.emitter.open  # a chat round's last item closes after the round
            if held is not None:
                produced = [*produced, {"type": held.kind, **held.item, "content": "".join(held.parts)}]
            span.messages(self.p.request.instructions, model_items, produced)
