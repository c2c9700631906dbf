"""``GatewayASGIMiddleware`` (below Django, sees every request unbuffered) and ``GatewayErrorMiddleware``.

The ASGI middleware assigns the request id, enforces the ``[server]`` limits the ASGI server has no
setting for (head size and header count, body read timeout, body ceiling, the same ceiling per
WebSocket message), refuses new requests while draining, counts metrics and writes the access log.
The Django middleware renders a raised :class:`GatewayError`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse

from gateway.core import errors
from gateway.core.config import ServerConfig, get_config
from gateway.core.ids import request_id_for
from gateway.core.lifecycle import drain
from gateway.core.logging import request_id_var
from gateway.core.metrics import WS_OPEN
from gateway.core.pipeline import PASSAGE, REQUEST_ID, Passage, body_limit, body_too_large, finish

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# WebSocket close code for a message over the size limit (RFC 6455 "message too big").
WS_CLOSE_TOO_BIG = 1009


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value
    return None


class _HttpState:
    """One HTTP request's bookkeeping in :class:`GatewayASGIMiddleware`."""

    __slots__ = ("body_read", "late", "reader", "received", "refused", "status", "timer")

    def __init__(self) -> None:
        self.status = 0  # set when the response starts
        self.refused = False  # answered here (body ceiling, read timeout): the app is ignored
        self.received = 0
        self.body_read = False  # the request's last body message has arrived
        # The body's read deadline: one timer armed at the first receive() (cheaper than an
        # ``asyncio.timeout`` per receive); past it, a waiting receive() is interrupted.
        self.timer: asyncio.TimerHandle | None = None
        self.late = False
        self.reader: asyncio.Task[Any] | None = None  # the task waiting in receive(), if any

    def read_due(self) -> None:
        self.timer = None
        self.late = True
        if self.reader is not None:
            self.reader.cancel()

    def read_done(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def head_refusal(scope: Scope, limits: ServerConfig) -> errors.GatewayError | None:
    """The 431/414 for a head over ``[server] max_request_headers`` or ``max_request_head_size_bytes``
    (the request target and header fields, as the ASGI server parsed them); None: within both."""
    headers = scope["headers"]
    if len(headers) > limits.max_request_headers:
        return errors.too_many_headers(limits.max_request_headers)
    line = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
    size = line + sum([len(name) + len(value) + 4 for name, value in headers])
    if size <= limits.max_request_head_size_bytes:
        return None
    if 2 * line > size:  # the request line is most of it
        return errors.uri_too_long(limits.max_request_head_size_bytes)
    return errors.head_too_large(limits.max_request_head_size_bytes)


class GatewayASGIMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        incoming: bytes | None = None
        declared: bytes | None = None
        for key, value in scope["headers"]:
            if key == b"x-request-id":
                incoming = value
            elif key == b"content-length":
                declared = value
        passage = Passage(
            scope.get("method", ""),
            scope.get("path", ""),
            incoming.decode("latin-1") if incoming else None,
            declared.decode("latin-1") if declared is not None else None,
        )
        rid = passage.request_id
        scope[REQUEST_ID] = rid
        scope[PASSAGE] = passage
        limits = get_config().server
        limit = body_limit(passage.method, passage.path)
        refusal = head_refusal(scope, limits)
        if refusal is None and drain.draining:
            refusal = errors.shutting_down()
        if refusal is not None:
            passage.refusal = refusal
        read_timeout = limits.request_read_timeout_s
        loop = asyncio.get_running_loop()
        read_by = loop.time() + read_timeout  # the body's deadline, from its head's arrival
        state = _HttpState()
        timed_out = errors.request_timeout
        rid_header = (b"x-request-id", rid.encode("latin-1"))

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                if state.status:
                    return
                state.status = message["status"]
                message["headers"] = [*message.get("headers", ()), rid_header]
                if passage.quota is not None:  # an admitted request of a limited principal
                    message["headers"].extend(passage.quota.headers)
            elif state.refused:
                return  # the app answers after we already refused: drop it
            await send(message)

        async def receive_wrapper() -> Message:
            if state.refused:
                return {"type": "http.disconnect"}
            if state.body_read:
                return await receive()  # the app waits for a disconnect: no deadline
            if state.late:
                await self._refuse(scope, send_wrapper, state, timed_out(read_timeout))
                return {"type": "http.disconnect"}
            if state.timer is None:
                state.timer = loop.call_at(read_by, state.read_due)
            reader = state.reader = asyncio.current_task()
            try:
                message = await receive()
            except asyncio.CancelledError:
                # Ours (the deadline), unless someone else cancelled the reader too.
                if not state.late or reader is None or reader.uncancel() > 0:
                    raise
                await self._refuse(scope, send_wrapper, state, timed_out(read_timeout))
                return {"type": "http.disconnect"}
            finally:
                state.reader = None
            if message["type"] != "http.request":
                state.body_read = True  # a disconnect: nothing more to wait for
                state.read_done()
            else:
                state.received += len(message.get("body", b""))
                if state.received > limit:
                    too_large = body_too_large(passage.method, passage.path)
                    await self._refuse(scope, send_wrapper, state, too_large)
                    return {"type": "http.disconnect"}
                if not message.get("more_body", False):
                    state.body_read = True
                    state.read_done()
            return message

        try:
            if passage.refusal is not None:
                await self._refuse(scope, send_wrapper, state, passage.refusal)
                return
            await self.app(scope, receive_wrapper, send_wrapper)
        except Exception as exc:
            if state.status:
                raise  # an answer has begun: the server cuts it off
            # A bug below Django (Django renders its own): the envelope, not the server's plain 500.
            logging.getLogger("gateway").exception("unhandled error on %s", scope.get("path", ""))
            await errors.asgi_send(send_wrapper, errors.as_gateway_error(exc), scope)
        finally:
            state.read_done()
            finish(passage, state.status)  # no response: the client went away first (499)

    async def _refuse(self, scope: Scope, send: Send, state: _HttpState, exc: errors.GatewayError) -> None:
        if state.status:
            return
        await errors.asgi_send(send, exc, scope)
        state.refused = True

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        incoming = _header(scope, b"x-request-id")
        # The pipeline's request-id rule; the connection's log lines carry it (its consumer runs
        # in this task's context).
        rid = scope[REQUEST_ID] = request_id_for(incoming.decode("latin-1") if incoming else None)
        token = request_id_var.set(rid)
        limit = get_config().server.max_request_body_size_bytes
        accepted = False

        async def send_wrapper(message: Message) -> None:
            nonlocal accepted
            if message["type"] == "websocket.accept" and not accepted:
                accepted = True
                WS_OPEN.inc()
            await send(message)

        async def receive_wrapper() -> Message:
            message = await receive()
            if message["type"] == "websocket.receive":
                size = len(message.get("bytes") or b"") + len((message.get("text") or "").encode("utf-8"))
                if size > limit:
                    await send({"type": "websocket.close", "code": WS_CLOSE_TOO_BIG})
                    return {"type": "websocket.disconnect", "code": WS_CLOSE_TOO_BIG}
            return message

        drain.websockets += 1  # the drain waits for it to close (gateway.core.lifecycle)
        try:
            await self.app(scope, receive_wrapper, send_wrapper)
        finally:
            drain.websockets -= 1
            request_id_var.reset(token)
            if accepted:
                WS_OPEN.dec()


class GatewayErrorMiddleware:
    """Renders :class:`GatewayError` (and unexpected exceptions on ``/v1``) as envelopes."""

    sync_capable = False
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Awaitable[HttpResponse]]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(self.get_response):
            markcoroutinefunction(self)

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        return await self.get_response(request)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if isinstance(exc, errors.GatewayError):
            return errors.django_response(exc, request)
        if request.path.startswith("/v1/"):
            logging.getLogger("gateway").exception("unhandled error on %s", request.path)
            return errors.django_response(errors.as_gateway_error(exc), request)
        return None
