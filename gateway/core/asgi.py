"""ASGI helpers every serving path shares: reading a request body, noticing the client leave, and
answering with an error envelope."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from gateway.core import errors

Scope = dict[str, Any]


Message = dict[str, Any]


Receive = Callable[[], Awaitable[Message]]


Send = Callable[[Message], Awaitable[None]]


RawHeaders = list[tuple[bytes, bytes]]


SSE_CONTENT_TYPE = "text/event-stream"


# How long a relay runs before a task starts watching for the client's disconnect.
WATCH_AFTER_S = 0.05


class ClientDisconnected(Exception):
    """The client went away (or the body ceiling refused its upload) before the body was read."""


class Exchange:
    """Per-request state shared by the relay and its disconnect watcher."""

    __slots__ = ("body_done", "client_gone", "finished")

    def __init__(self) -> None:
        self.client_gone = False
        self.finished = False
        self.body_done: asyncio.Event | None = None


async def read_body(receive: Receive, exchange: Exchange) -> bytes:
    """The whole (small, JSON) request body; the ASGI middleware already enforces the ceiling."""
    message = await receive()
    if message["type"] == "http.disconnect":
        exchange.client_gone = True
        raise ClientDisconnected
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return body
    parts = [body]
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            exchange.client_gone = True
            raise ClientDisconnected
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


async def stream_body(receive: Receive, exchange: Exchange) -> AsyncIterator[bytes]:
    """The request body, chunk by chunk as the client sends it (fed straight to the upstream)."""
    assert exchange.body_done is not None
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            # The client left, or the body ceiling cut the upload off (it already answered 413).
            exchange.client_gone = True
            raise ClientDisconnected
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            exchange.body_done.set()
            return


async def client_left(receive: Receive, exchange: Exchange) -> None:
    """Return once the client has disconnected (its request body read first, if it streams)."""
    if exchange.body_done is not None:
        await exchange.body_done.wait()
    while (await receive())["type"] != "http.disconnect":
        pass
    exchange.client_gone = True


class DisconnectWatch:
    """Cancel the current task (and its upstream work) the moment the client disconnects.

    ``left()`` returns once the client has gone; ``finished()`` says whether the answer was complete
    then. The watcher task starts only for requests still running after ``WATCH_AFTER_S``. A
    cancellation the watch caused ends the block quietly.
    """

    def __init__(self, left: Callable[[], Awaitable[None]], finished: Callable[[], bool]) -> None:
        self._left = left
        self._finished = finished
        self.gone = False
        self._watcher: asyncio.Task[None] | None = None

    def __enter__(self) -> DisconnectWatch:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, self._start)
        return self

    def _start(self) -> None:
        self._watcher = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        await self._left()
        if not self._finished():
            self.gone = True
            self._task.cancel()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        self._timer.cancel()
        # Dropped, not only cancelled: the cancelled watcher's exception holds its frame, which
        # holds this watch (a reference cycle that only a full garbage collection would free).
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
        # The client left: the caller closes the upstream work; there is no one to answer.
        return exc_type is asyncio.CancelledError and self.gone and self._task.uncancel() == 0


def encode_headers(headers: list[tuple[str, str]]) -> RawHeaders:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]


async def send_error(
    send: Send,
    scope: Scope,
    exc: errors.GatewayError,
    extra_headers: RawHeaders = (),  # type: ignore[assignment]
) -> None:
    """Answer with ``exc`` in the envelope of the route (OpenAI, or Anthropic on ``/v1/messages``)."""
    if not extra_headers:
        await errors.asgi_send(send, exc, scope)
        return

    async def with_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message["headers"], *extra_headers]
        await send(message)

    await errors.asgi_send(with_headers, exc, scope)
