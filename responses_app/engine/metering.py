"""The usage-ledger rows of one response's upstream calls (``docs/responses.md``).

A :class:`Meter` is made with each executor (a multi-agent response's agents share their coordinator's)
and with each ``POST /v1/responses/compact``. Every upstream call (an inference round, a compaction
summary) becomes one :class:`~usage_app.ledger.UsageEntry` when it ends, with the tokens the upstream
reported for that call. A stored response's entries are counted then (:func:`ledger.observe`) and
written in its final write (:meth:`Meter.take`); an unstored one's are recorded at once
(:func:`ledger.record`); entries a final write did not store are queued for the batch writer
(:meth:`Meter.unwritten`), so each call is written once. Nothing here raises to the request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from gateway.core.errors import GatewayError
from gateway.core.logging import request_id_var
from gateway.core.principal import Principal
from gateway.core.sse import StreamFailure
from responses_app.engine.domain import Prepared, Usage
from usage_app import ledger, writer
from usage_app.tap import ModelCall, Tokens, UsageTap, count

log = logging.getLogger("responses.metering")

ROUTE = "/v1/responses"
COMPACT_ROUTE = "/v1/responses/compact"
CLIENT_LEFT = 499

NO_TOKENS: Tokens = (None, None, None, None)


def current_request_id() -> str:
    """The request id of the running request ("" outside one)."""
    value = request_id_var.get()
    return "" if value == "-" else value


@dataclass(slots=True)
class Call:
    """One upstream call in flight: when it started, and what the upstream answered so far."""

    started: float  # time.perf_counter()
    started_at: float  # time.time()
    received: int | None = None  # the upstream's HTTP status, once it answered


def failed_status(exc: BaseException, received: int | None) -> int:
    """The ledger status of a call that ended with ``exc``: 499 when the client left (the run was
    closed or cancelled), the upstream's own status when it refused, 502/504 when it failed."""
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return CLIENT_LEFT
    if received is not None and received != 200:
        return received
    if isinstance(exc, (StreamFailure, GatewayError)):
        status = exc.status
        return status if isinstance(status, int) and status >= 500 else 502
    return received if received is not None else 502  # our own failure (an event too large)


@dataclass(frozen=True, slots=True)
class Reading:
    """A :class:`Usage` total at one moment, to take one round's part of it (:meth:`Meter.delta`)."""

    reports: int
    input_tokens: int
    output_tokens: int
    cached: int | None
    reasoning: int | None

    @classmethod
    def of(cls, usage: Usage) -> Reading:
        return cls(
            usage.reports,
            usage.input_tokens,
            usage.output_tokens,
            usage.input_details.get("cached_tokens"),
            usage.output_details.get("reasoning_tokens"),
        )

    def since(self, before: Reading) -> Tokens:
        """What was reported between ``before`` and this reading (nothing: all None)."""
        if self.reports == before.reports:
            return NO_TOKENS

        def part(after: int | None, earlier: int | None) -> int | None:
            return None if after is None else after - (earlier or 0)

        return (
            self.input_tokens - before.input_tokens,
            self.output_tokens - before.output_tokens,
            part(self.cached, before.cached),
            part(self.reasoning, before.reasoning),
        )


class Meter:
    """The ledger entries of one response's upstream calls (see the module docstring)."""

    def __init__(self, p: Prepared, route: str = ROUTE) -> None:
        self.principal = p.principal
        self.model = p.request.model or ""
        self.response_id = p.response_id
        # Captured now: a background response's task may run in another context.
        self.request_id = p.request_id or current_request_id()
        self.route = route
        self.store = p.store
        self.pending: list[ledger.UsageEntry] = []  # a stored response's, until its final write
        self.settled = False  # the run is over: a call that ends later is recorded alone

    @staticmethod
    def start() -> Call:
        return Call(time.perf_counter(), time.time())

    def end(self, call: Call, status: int, tokens: Tokens) -> None:
        """The call is over: count it, and keep its row for the final write (stored) or queue it."""
        try:
            # An upstream's nonsense count (negative, too large) is null, never a failed write.
            input_tokens, output_tokens, cached, reasoning = (count(t) for t in tokens)
            entry = ledger.UsageEntry(
                principal=self.principal,
                route=self.route,
                model=self.model,
                status=status,
                started_at=call.started_at,
                latency_ms=ledger.since(call.started),
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                cached_tokens=cached,
                reasoning_tokens=reasoning,
                response_id=self.response_id,
                request_id=self.request_id,
            )
            if self.store and not self.settled:
                ledger.observe(entry)
                self.pending.append(entry)
            else:
                ledger.record(entry)
        except Exception:  # the ledger never fails a response
            log.exception("usage ledger: response %s's call not counted", self.response_id)

    def take(self) -> list[ledger.UsageEntry]:
        """The entries a final write stores now (they are this meter's no more)."""
        taken, self.pending = self.pending, []
        return taken

    @staticmethod
    def unwritten(entries: list[ledger.UsageEntry]) -> None:
        """Entries a final write did not store: the batch writer writes them (counted already)."""
        for entry in entries:
            try:
                writer.queue(entry)
            except Exception:
                log.exception("usage ledger: a row of response %s was lost", entry.response_id)

    def settle(self) -> None:
        """The run is over: entries no final write took go to the batch writer, and so will a call
        that ends after it (an unclosed round finalized later)."""
        self.settled = True
        if self.pending:
            self.unwritten(self.take())


class DirectCall:
    """The ledger row of a request relayed byte for byte to the upstream's ``/v1/responses`` (the
    direct path): the usage read passively from the answer as it passes (:class:`UsageTap`: a JSON
    answer's ``usage``, a stream's terminal event's ``response.usage``), the bytes untouched, the
    upstream's response id kept. :meth:`end` records it once."""

    def __init__(self, principal: Principal, model: str, limit: int) -> None:
        self.call = ModelCall(principal, ROUTE, model)
        self.limit = limit  # the most bytes kept to read an answer or an event from
        self.tap: UsageTap | None = None
        self.received: int | None = None

    def answered(self, status: int, content_type: str) -> None:
        self.received = status
        self.tap = UsageTap(sse=content_type.startswith("text/event-stream"), max_bytes=self.limit)

    def feed(self, chunk: bytes) -> None:
        if self.tap is None:
            return
        try:
            self.tap.feed(chunk)
        except Exception:  # never the relay's problem
            log.debug("usage ledger: could not read a direct answer", exc_info=True)

    def end(self, status: int | None = None) -> None:
        """Record the row (once): ``status`` when the call ended otherwise than as the upstream answered."""
        if self.call.recorded:
            return
        tap, usage = self.tap, {}
        if tap is not None:
            try:
                usage = tap.finish()
            except Exception:
                log.debug("usage ledger: could not read a direct answer", exc_info=True)
            if status == CLIENT_LEFT and tap.complete:
                status = None  # the whole answer passed: the client only left after it
            self.call.response_id = tap.answer_id  # the upstream's
        self.call.record(status if status is not None else (self.received or 502), usage)
