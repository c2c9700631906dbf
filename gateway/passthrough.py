"""The pass-through routes: Chat Completions, Completions, Embeddings, Audio, vLLM's own routes
(rerank, score, pooling, classify, tokenize, detokenize, speech) and ``[passthrough] extra_routes``.

These bodies belong to the upstream's contract, not ours: the request is forwarded to
``{LLM_API_BASE}`` byte for byte and the answer is relayed as it arrives — status, headers (minus
hop-by-hop) and every body chunk, with no JSON parsing and no per-chunk work. Audio uploads are
streamed to the upstream while the client is still sending them, so a file is never held in memory.

The routes are registered in :mod:`gateway.fastroutes` and served at the ASGI layer by
:mod:`gateway.fastpath` (below Django, above nothing but ``GatewayASGIMiddleware``), because Django's
request handling costs more than the relay itself; see ``docs/performance.md``. :func:`relay` is the
one implementation every pass-through route uses; the Anthropic routes (:mod:`gateway.messages`)
use it too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gateway import errors
from gateway.config import get_config
from inference_app.upstream import UpstreamResponse, forward_headers, get_upstream

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
RawHeaders = list[tuple[bytes, bytes]]

SSE_CONTENT_TYPE = "text/event-stream"
# How long a relay runs before a task starts watching for the client's disconnect.
WATCH_AFTER_S = 0.05
_DONE = b"data: [DONE]\n\n"


def openai_stream_error(exc: errors.GatewayError) -> bytes:
    """A failed OpenAI-style stream ends as vLLM ends one: an error chunk, then ``[DONE]``."""
    return errors.openai_sse_error(exc) + _DONE


@dataclass(frozen=True)
class Route:
    """One pass-through route: where it goes upstream and how a broken stream ends."""

    upstream_path: str
    # Audio uploads are streamed to the upstream instead of read first.
    stream_request_body: bool = False
    # The event that ends an event stream the upstream broke off (stall or connection loss).
    stream_error: Callable[[errors.GatewayError], bytes] = openai_stream_error
    methods: frozenset[str] = field(default_factory=lambda: frozenset({"POST"}))
    # A request whose body ``divert`` says yes to is served by ``diverted`` on the ASGI path instead
    # of being relayed (the Messages server-tool loop). ``diverted`` gets the headers to forward.
    divert: Callable[[bytes], bool] | None = None
    diverted: Callable[..., Awaitable[None]] | None = None


# vLLM's routes beyond the OpenAI API, relayed like the others (same path upstream). Their bodies
# are vLLM's contract, so they are not in the gateway's OpenAPI document (docs/passthrough.md).
VLLM_ROUTES = (
    "/v1/rerank",
    "/rerank",
    "/v1/score",
    "/score",
    "/pooling",
    "/classify",
    "/tokenize",
    "/detokenize",
    "/v1/audio/speech",
)

ROUTES: dict[str, Route] = {
    "/v1/chat/completions": Route("/v1/chat/completions"),
    "/v1/completions": Route("/v1/completions"),
    "/v1/embeddings": Route("/v1/embeddings"),
    "/v1/audio/transcriptions": Route("/v1/audio/transcriptions", stream_request_body=True),
    "/v1/audio/translations": Route("/v1/audio/translations", stream_request_body=True),
    **{path: Route(path) for path in VLLM_ROUTES},
}


def extra_routes(paths: tuple[str, ...]) -> dict[str, Route]:
    """The operator's ``[passthrough] extra_routes``: each relayed to the same path upstream (POST),
    with the rules of every pass-through route. A built-in route of the same path wins."""
    return {path: Route(path) for path in paths if path not in ROUTES}


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


async def _stream_body(receive: Receive, exchange: Exchange) -> AsyncIterator[bytes]:
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
    """Cancel the current task (and so its upstream work) the moment the client disconnects.

    ``with DisconnectWatch(left, finished):`` — ``left()`` returns once the client has gone, and
    ``finished()`` says whether the answer was already complete then (nothing left to cancel). Most
    requests finish well under ``WATCH_AFTER_S``, so the watcher (a task) is only started for the
    ones still running then, which keeps it off the hot path. A cancellation the watch caused ends
    the block quietly; any other propagates. The relay below and the Responses fast path use it.
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


def _encode_headers(headers: list[tuple[str, str]]) -> RawHeaders:
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


async def relay(
    route: Route,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    credential_consumed: bool,
    extra_headers: RawHeaders,
    headers: dict[str, str] | None = None,
) -> None:
    """Forward one request to the upstream and relay its answer as it arrives.

    ``extra_headers`` (CORS) are added to the response. A client disconnect at any point cancels the
    upstream request at once; upstream failures answer 502/504 in the route's envelope, or — once
    an event stream has started — end it with the route's error event. ``headers`` are the request
    headers already decoded (names lower-cased), when the caller has them.
    """
    config = get_config()
    exchange = Exchange()
    if headers is None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    headers = forward_headers(headers, config, caller_credential_consumed=credential_consumed)
    body: bytes | AsyncIterator[bytes]
    if route.stream_request_body:
        exchange.body_done = asyncio.Event()
        body = _stream_body(receive, exchange)
        declared = _declared_length(scope)
        if declared is not None:
            headers["content-length"] = declared  # same framing upstream as the client used
    else:
        try:
            body = await read_body(receive, exchange)
        except ClientDisconnected:
            return
        if route.divert is not None and route.diverted is not None and route.divert(body):
            await route.diverted(
                scope, body, receive, send, headers=headers, extra_headers=extra_headers, exchange=exchange
            )
            return
    await forward(route, scope, receive, send, exchange, body, headers=headers, extra_headers=extra_headers)


async def forward(
    route: Route,
    scope: Scope,
    receive: Receive,
    send: Send,
    exchange: Exchange,
    body: bytes | AsyncIterator[bytes],
    *,
    headers: dict[str, str],
    extra_headers: RawHeaders,
) -> None:
    """Send ``body`` to the route's upstream path and relay the answer (what :func:`relay` does once
    it has the body; a diverted route that rewrote the body relays its answer with it too)."""
    response: UpstreamResponse | None = None
    try:
        with DisconnectWatch(lambda: client_left(receive, exchange), lambda: exchange.finished):
            query = scope.get("query_string", b"").decode("latin-1")
            try:
                response = await get_upstream().send(
                    scope["method"], route.upstream_path, body=body, headers=headers, query=query
                )
            except errors.GatewayError as exc:
                if not exchange.client_gone:
                    await send_error(send, scope, exc, extra_headers)
                return
            await _relay_response(response, scope, send, exchange, route, extra_headers)
    finally:
        if response is not None:
            await response.aclose()


async def _relay_response(
    response: UpstreamResponse,
    scope: Scope,
    send: Send,
    exchange: Exchange,
    route: Route,
    extra_headers: RawHeaders,
) -> None:
    raw_headers = _encode_headers(response.headers)
    if extra_headers:
        raw_headers.extend(extra_headers)
    head = {"type": "http.response.start", "status": response.status, "headers": raw_headers}
    length = response.header("content-length")
    remaining = int(length) if length and length.isdigit() else -1
    start: Message | None = head
    if remaining < 0:
        await send(head)  # a body without a length (a stream): its head goes out at once
        start = None
    # A sized body's head waits for its first bytes (the server writes them together anyway):
    # an upstream that breaks off before them still gets an error answer.
    try:
        async for chunk in response:
            if start is not None:
                await send(start)
                start = None
            if remaining >= 0:
                remaining -= len(chunk)
                if remaining <= 0:
                    # A sized body's last chunk ends the response in the same message.
                    exchange.finished = True
                    await send({"type": "http.response.body", "body": chunk, "more_body": False})
                    return
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except errors.GatewayError as exc:
        if start is not None:
            exchange.finished = True
            await send_error(send, scope, exc, extra_headers)
            return
        if response.content_type != SSE_CONTENT_TYPE:
            raise  # a sized or plain body cannot carry an error: the connection is dropped
        exchange.finished = True
        await send({"type": "http.response.body", "body": route.stream_error(exc), "more_body": False})
        return
    if start is not None:
        await send(start)  # an empty sized body
    exchange.finished = True
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _declared_length(scope: Scope) -> str | None:
    for key, value in scope["headers"]:
        if key == b"content-length":
            text = value.decode("latin-1").strip()
            return text if text.isdigit() else None
    return None
