"""One response's lifecycle: its object and the events around its work, with exactly one end.

:class:`Lifecycle` (base of the executor) owns the snapshot, the event sink, the emitter and the
order: ``response.created``, ``response.in_progress``, :meth:`rounds`, then one terminal event, or one
``error`` event when that cannot be sent. Subclasses fill :meth:`prepare_tools`, :meth:`rounds`,
:meth:`settle` and :meth:`store`. Nothing fake is sent: an upstream failure ends ``failed``, and the
terminal snapshot is written before the terminal event, so a failed write reaches the client.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from gateway.core import errors, metrics
from gateway.core.config import Config
from gateway.core.logging import request_id_var
from gateway.core.sse import Event, EventSink, EventTooLarge, StreamFailure, error_frame
from responses_app.engine.domain import TERMINAL_EVENT, Prepared, Usage, base_snapshot
from responses_app.engine.echo import tool_usage
from responses_app.engine.emitter import Emitter
from responses_app.engine.translate import ToolMap

log = logging.getLogger("responses.executor")  # the executor's own log: this is its base class


def unstored_message(error: BaseException | None) -> str:
    """The message of a response that could not be stored (``error``: why, when known)."""
    return "The response could not be stored" + (f": {type(error).__name__}." if error is not None else ".")


class Lifecycle:
    """The events around one response's work and its one end (see the module docstring)."""

    def __init__(
        self,
        prepared: Prepared,
        config: Config,
        client_tools: ToolMap,
        *,
        event_fields: dict[str, Any] | None = None,
    ) -> None:
        self.p = prepared
        self.config = config
        # ``event_fields`` (the WebSocket ``stream_id``) ride on every event and count toward
        # max_stream_event_bytes, as the client receives them.
        self.sink = EventSink(config.responses.max_stream_event_bytes, extra=event_fields)
        self.emitter = Emitter(
            self.sink, client_tools, max_retained_bytes=config.responses.max_retained_bytes
        )
        self.usage = Usage()
        self.service_tier: str | None = None
        self.error: dict[str, Any] | None = None
        self.incomplete_details: dict[str, Any] | None = None
        self.end_status = "completed"  # how the work ended (set by ``rounds``)
        self.final: dict[str, Any] | None = None  # the terminal snapshot once sent
        self.failure_event: Event | None = None  # the error event, when one ended the stream
        self.store_refusal: errors.GatewayError | None = None  # set when storing was refused
        self._finishing = False  # _finish has begun: an error there ends with an ``error`` event
        # Background runs flush their persisted events here, before the terminal snapshot is written.
        self.before_store: Any = None
        # A stored stream's ``in_progress`` row is written (SSE: begun) here, before response.created
        # (runs._StreamLease.take), with the response object it starts as.
        self.before_start: Any = None
        self.initial_status = "queued" if prepared.background else "in_progress"
        self._base: dict[str, Any] | None = None

    @property
    def output(self) -> list[dict[str, Any]]:
        """The response's output items so far."""
        return self.emitter.output

    # --- the response object -------------------------------------------------------------------

    def snapshot(self, status: str) -> dict[str, Any]:
        """The response object now, with ``status``."""
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

    # --- the events around the work ------------------------------------------------------------

    async def run(self) -> AsyncIterator[Event]:
        """Every event of the response, in order, ending with exactly one terminal or error event.

        The outermost guard of every streaming path: an unexpected exception is logged once and still ends
        the response ``failed`` (``response.failed``, or ``error`` before it started), stored as failed.
        """
        metrics.responses_in_flight(1)
        try:
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
            # Nothing changes the object before the work begins: one snapshot serves the in_progress row and
            # both opening events.
            started: dict[str, Any] | None = None
            if self.before_start is not None:
                started = self.snapshot("in_progress")
                await self.before_start(started)
            try:
                if self.sink.unread:
                    # Nobody reads them (a JSON client's answer is the final object): numbered, not
                    # made, which saves two snapshots of the response.
                    self.sink.skip(2)
                else:
                    if started is None:
                        started = self.snapshot("in_progress")
                    created = (
                        started
                        if self.initial_status == "in_progress"
                        else self.snapshot(self.initial_status)
                    )
                    yield self.sink.make("response.created", response=created)
                    yield self.sink.make("response.in_progress", response=started)
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
        finally:
            metrics.responses_in_flight(-1)
            self.run_ended()

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

    # --- the seams -----------------------------------------------------------------------------

    async def prepare_tools(self) -> None:
        """Before anything is sent (again when the caller did already): a refusal is the run's end."""
        raise NotImplementedError

    def rounds(self) -> AsyncGenerator[Event, None]:
        """The response's work between ``response.in_progress`` and its terminal event."""
        raise NotImplementedError

    def settle(self) -> None:
        """Runs once the work ended (failed included), before the terminal snapshot; nothing here."""

    def run_ended(self) -> None:
        """Runs when :meth:`run` is over, however it ended (closed or cancelled included); nothing here."""

    async def store(
        self, status: str, snapshot: dict[str, Any], terminal: tuple[int, bytes] | None = None
    ) -> None:
        """Store the response's outcome; ``terminal``: the terminal event's sequence number and bytes."""
        raise NotImplementedError

    # --- the end -------------------------------------------------------------------------------

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
                # Only a background response stores its terminal event (its stream is replayed).
                stored_event = (
                    (terminal.data["sequence_number"], terminal.json) if self.p.background else None
                )
                await self.store(status, snapshot, stored_event)
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
                message = unstored_message(exc)
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
