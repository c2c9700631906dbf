"""Server-sent events in both directions.

``read_sse`` parses an upstream byte stream into ``(event, data)`` pairs and enforces
``max_upstream_sse_line_bytes`` while it buffers; ``EventSink`` numbers and serializes the events
we send (``sequence_number`` strictly increasing from 0) and enforces ``max_stream_event_bytes``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from typing import Any

import orjson

from gateway.core import errors


class StreamFailure(Exception):
    """The upstream stream cannot complete this response (truncated, malformed, too large, error)."""

    def __init__(self, message: str, *, code: str = "server_error", status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status

    def response_error(self) -> dict[str, Any]:
        """The failed response's ``error``: an upstream 429 is ``rate_limit_exceeded``, another 4xx
        ``invalid_prompt``; any other code than those and ``server_error`` is ``server_error``."""
        code = self.code
        if self.status == 429:
            code = "rate_limit_exceeded"
        elif self.status is not None and 400 <= self.status < 500:
            code = "invalid_prompt"
        elif code not in ("server_error", "rate_limit_exceeded", "invalid_prompt"):
            code = "server_error"
        return {"code": code, "message": self.message}


class EventTooLarge(Exception):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"A stream event of {size} bytes exceeds max_stream_event_bytes ({limit} bytes).")
        self.message = str(self)


async def read_sse(
    chunks: AsyncIterable[bytes], max_line_bytes: int
) -> AsyncIterator[tuple[str | None, bytes]]:
    """``(event name, data)`` for every complete SSE event; a partial last event is dropped."""
    pending: list[bytes] = []  # the unterminated tail, kept as pieces so a long line costs O(n)
    pending_len = 0
    event: str | None = None
    data: list[bytes] = []
    async for chunk in chunks:
        # find, not "in": bytes.__contains__ first tries its operand as an integer and raises
        # (and clears) a TypeError for a bytes one, on every chunk.
        if chunk.find(b"\n") < 0:
            pending.append(chunk)
            pending_len += len(chunk)
            if pending_len > max_line_bytes:
                raise _line_too_long(max_line_bytes)
            continue
        buffer = b"".join([*pending, chunk]) if pending else chunk
        lines = buffer.split(b"\n")
        tail = lines.pop()  # after the last newline: the next chunk continues it
        short = len(buffer) <= max_line_bytes  # then no line in it can be over the limit
        for line in lines:
            if not short and len(line) > max_line_bytes:
                raise _line_too_long(max_line_bytes)
            if line[-1:] == b"\r":
                line = line[:-1]
            if not line:
                if data:
                    yield event, data[0] if len(data) == 1 else b"\n".join(data)
                event, data = None, []
                continue
            if line[:1] == b":":
                continue  # comment (keep-alive)
            name, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                data.append(value)
            elif name == b"event":
                event = value.decode("utf-8", "replace")
        pending, pending_len = ([tail], len(tail)) if tail else ([], 0)
        if pending_len > max_line_bytes:
            raise _line_too_long(max_line_bytes)


def _line_too_long(limit: int) -> StreamFailure:
    return StreamFailure(
        f"An upstream SSE line exceeded max_upstream_sse_line_bytes ({limit} bytes).",
        code="server_error",
    )


class Event:
    """One outbound event: type, members and SSE frame; an unread event (:attr:`EventSink.unread`) gets its
    frame only when asked, from its members as they are then."""

    __slots__ = ("_frame", "data", "type")

    def __init__(self, type: str, data: dict[str, Any], frame: bytes | None = None) -> None:
        self.type = type
        self.data = data
        self._frame = frame

    @property
    def frame(self) -> bytes:
        if self._frame is None:
            self._frame = _frame(self.type, orjson.dumps(self.data))
        return self._frame

    @property
    def json(self) -> bytes:
        return self.frame[self.frame.index(b"data: ") + 6 : -2]

    def __repr__(self) -> str:
        return f"Event({self.type!r}, {self.data!r})"


def _frame(type_: str, body: bytes) -> bytes:
    return b"event: " + type_.encode() + b"\ndata: " + body + b"\n\n"


class EventSink:
    """Numbers, serializes and size-checks outbound events; with ``unread`` (a JSON client's response)
    they are only numbered."""

    def __init__(self, max_event_bytes: int, start: int = 0, extra: dict[str, Any] | None = None) -> None:
        self.sequence_number = start
        self.max_event_bytes = max_event_bytes
        self.extra = extra or {}
        self.unread = False

    def skip(self, count: int) -> None:
        """Number ``count`` events that an unread sink does not make (their numbers stay taken)."""
        assert self.unread, "a read sink makes every event it numbers"
        self.sequence_number += count

    def make(self, type_: str, **fields: Any) -> Event:
        data = {"type": type_, **fields, "sequence_number": self.sequence_number, **self.extra}
        if self.unread:
            self.sequence_number += 1
            return Event(type_, data)
        body = orjson.dumps(data)
        if len(body) > self.max_event_bytes:
            raise EventTooLarge(len(body), self.max_event_bytes)
        self.sequence_number += 1
        return Event(type_, data, _frame(type_, body))


def error_frame(*, code: str | None, message: str, param: str | None, sequence_number: int) -> Event:
    """The ``error`` stream event (``openai.types.responses.ResponseErrorEvent``)."""
    exc = errors.GatewayError(message, param=param, code=code)
    frame = errors.responses_sse_error(exc, sequence_number)
    data = orjson.loads(frame[frame.index(b"data: ") + 6 : -2])
    return Event("error", data, frame)


class _Resume:
    """Await the rest of ``step``, a coroutine already run up to its first suspension; cancellation and
    exceptions are forwarded into it as if the task had awaited it from the start."""

    __slots__ = ("pending", "step")

    def __init__(self, step: Any, pending: Any) -> None:
        self.step = step
        self.pending = pending

    def __await__(self) -> Any:
        pending = self.pending
        while True:
            try:
                yield pending
            except BaseException as exc:  # thrown into the task while it waited
                try:
                    pending = self.step.throw(exc)
                except StopIteration as done:
                    return done.value
                continue
            break
        return (yield from self.step.__await__())


def _abandon(step: Any, exc: BaseException) -> None:
    """Unwind a source step left waiting: ``exc`` is raised where it waits (its cleanup runs)."""
    try:
        step.throw(exc)
    except BaseException:
        return
    with contextlib.suppress(BaseException):  # it swallowed the exception and went on waiting
        step.close()


async def coalesce(frames: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    """``frames`` joined into as few writes as possible without delaying any: what the source produces
    without waiting goes out as one write, flushed whenever the source would wait."""
    iterator = frames.__aiter__()
    buffer: list[bytes] = []
    try:
        while True:
            step: Any = iterator.__anext__()
            try:
                pending = step.send(None)
            except StopIteration as done:
                buffer.append(done.value)
                continue
            except StopAsyncIteration:
                break
            if buffer:
                joined = b"".join(buffer)
                buffer.clear()
                try:
                    yield joined
                except BaseException as exc:  # closed (or thrown into) while the step waits
                    _abandon(step, exc)
                    raise
            try:
                frame = await _Resume(step, pending)
            except StopAsyncIteration:
                break
            buffer.append(frame)
    except Exception:
        if buffer:  # what the source produced before it failed still goes out first
            joined = b"".join(buffer)
            buffer.clear()
            yield joined
        raise
    finally:
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()
    if buffer:
        yield b"".join(buffer)
