"""The uvicorn protocols ``manage.py serve`` runs (the internals they rely on: ``gateway.relay``).

:class:`GatewayServerProtocol` relays the pass-through routes without the ASGI round trip
(:mod:`gateway.relay.callbacks`); for everything else, and in :class:`GatewayHttpProtocol` (the
relay switched off), there is one change to uvicorn: a sized response goes out in one write.

uvicorn writes the status line and headers to the socket as soon as the application sends
``http.response.start``, and the body with a second write. For a response with a
``Content-Length`` (every JSON answer, relayed or our own) the headers are useless to the client
without the body, so here they are held until the first body message and written together with it:
one system call per response instead of two, which is a measurable share of a small pass-through
request's cost (``docs/performance.md``). A streamed response (no length: SSE, chunked) has its
head and chunks held only until the end of the loop iteration that produced them, so they reach
the client as soon as before, in fewer writes (a stored SSE response: three instead of five; the
last chunk goes out with the chunked terminator).

:class:`GatewayHttpProtocol` also holds the ``[server]`` request limits (head size, header count,
read timeout) and answers uvicorn's own refusals in the gateway's envelope.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from gateway import errors
from gateway.config import get_config
from gateway.middleware import READ_TIMED_OUT, GatewayASGIMiddleware
from gateway.relay.framing import HeldWrites, chunk, status_line

log = logging.getLogger("gateway")


class _HeldHead:
    """Stands in for the transport while uvicorn writes the status line and headers."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    def close(self) -> None:  # uvicorn never closes while writing a head; be safe anyway
        return None


class _WithHead:
    """Stands in for the transport while uvicorn writes the first body bytes: head + body at once."""

    __slots__ = ("head", "transport")

    def __init__(self, transport: Any, head: bytes) -> None:
        self.transport = transport
        self.head = head

    def write(self, data: bytes) -> None:
        head, self.head = self.head, b""
        self.transport.write(head + data if head else data)

    def close(self) -> None:
        if self.head:
            self.transport.write(self.head)
            self.head = b""
        self.transport.close()


def _sized(message: dict[str, Any]) -> bool:
    return any(name.lower() == b"content-length" for name, _ in message.get("headers", ()))


class CoalescingCycle(RequestResponseCycle):
    """A request/response cycle that writes what one loop iteration produces in one write.

    A sized response's head is held until its body and written with it. A stream's head and its
    chunks before the last are held until the end of the loop iteration that produced them
    (``call_soon``): a stream gets its head at once, together with whatever the application sends
    in the same iteration, and its last chunk goes out with the chunked terminator.
    """

    _writes: HeldWrites | None = None

    @property
    def _held(self) -> HeldWrites:
        writes = self._writes
        if writes is None:
            writes = self._writes = HeldWrites(self)
        return writes

    async def send(self, message: Any) -> None:
        if self.scope["method"] != "HEAD":
            if not self.response_started and message["type"] == "http.response.start":
                await self._hold(message)
                if not _sized(message):
                    self._held.flush_soon()
                return
            if (
                self.response_started
                and not self.response_complete
                and message["type"] == "http.response.body"
                and message.get("more_body", False)
            ):
                await self._hold(message)
                self._held.flush_soon()
                return
        if self._writes is not None and self._writes.data:
            transport, proxy = self.transport, _WithHead(self.transport, self._writes.take())
            self.transport = proxy  # type: ignore[assignment]
            try:
                await super().send(message)
            finally:
                self.transport = transport
                if proxy.head and not self.disconnected:
                    transport.write(proxy.head)  # nothing was written (an error): what was held alone
            return
        await super().send(message)

    async def _hold(self, message: Any) -> None:
        """uvicorn's own ``send`` of ``message``, its bytes held (:attr:`_held`)."""
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()  # before the swap: uvicorn's send then never waits with it
        transport, holder = self.transport, _HeldHead()
        self.transport = holder  # type: ignore[assignment]
        try:
            await super().send(message)
        finally:
            self.transport = transport
        self._held.add(holder.data)


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a request the protocol refuses (``_refusal``)."""


# Longest path written to the access log for a request refused before it was parsed in full.
_LOGGED_PATH = 256


class GatewayHttpProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` whose requests run as :class:`CoalescingCycle`, within the server limits.

    The limits (``[server]``) hold before any application sees a request, on every path:

    - ``max_request_head_size_bytes``: the bytes of a request's head (request line and headers) are
      counted as they arrive; past the limit it is refused, 414 when the request line is most of
      it, else 431. httptools has no such limit and gathers a header in memory however long it is.
    - ``max_request_headers``: more header fields is a 431.
    - ``request_read_timeout_s``: a request, head and body, must arrive within this of its first
      byte (a new connection's first request: of the connection's start). A late head is answered
      408; a late body is answered 408 by whoever reads it (the relay, or the ASGI app told through
      :data:`gateway.middleware.READ_TIMED_OUT`), and the connection is closed if nobody has
      answered one timeout later.

    Every refusal is the gateway's envelope (``gateway.errors``), also for what uvicorn answers
    with plain text (bytes its parser refuses: ``send_400_response``), with ``Connection: close``.
    The read deadline is one timer per connection, re-armed only when it fires.
    """

    _in_head = True  # the parser is on a request's head, or waiting for the next one
    _head_bytes = 0  # bytes received since that head began
    _began: float | None = None  # loop time the request being read began; None: none is
    _read_timer: asyncio.TimerHandle | None = None
    _refusal: errors.GatewayError | None = None  # what a _Refused raised in a callback refuses

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = get_config().server
        self._max_head = limits.max_request_head_size_bytes
        self._max_headers = limits.max_request_headers
        self._read_timeout = limits.request_read_timeout_s
        self._request_begins()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._cancel_read_timer()

    def _cancel_read_timer(self) -> None:
        timer, self._read_timer = self._read_timer, None
        if timer is not None:
            timer.cancel()

    def data_received(self, data: bytes) -> None:
        if not self._in_head:
            super().data_received(data)
            return
        self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self._max_head:
            self._refuse(self._head_refusal(len(getattr(self, "url", b"")), self._head_bytes))

    def _head_refusal(self, line: int, head: int) -> errors.GatewayError:
        """The refusal of a head of ``head`` bytes, ``line`` of them the request line's URL."""
        if 2 * line > head:  # the request line is most of it
            return errors.uri_too_long(self._max_head)
        return errors.head_too_large(self._max_head)

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers bytes its parser refuses here, and a _Refused raised in a callback is one.
        refusal, self._refusal = self._refusal, None
        self._refuse(refusal or errors.malformed_request())

    def on_message_begin(self) -> None:
        self._request_begins()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._head_complete()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._request_read()
        super().on_message_complete()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        cycle.__class__ = CoalescingCycle
        super()._start_asgi_task(cycle, app)

    # -- the limits --------------------------------------------------------------------------

    def _request_begins(self) -> None:
        if self._began is None:
            self._began = self.loop.time()
            if self._read_timer is None:
                self._read_timer = self.loop.call_at(self._began + self._read_timeout, self._read_due)

    def _head_complete(self) -> None:
        """The head is parsed: its bytes stop counting; too many header fields are refused."""
        self._in_head = False
        headers = self.headers
        if len(headers) > self._max_headers:
            self._refusal = errors.too_many_headers(self._max_headers)
            raise _Refused
        if self._head_bytes > self._max_head:
            # What arrived with the head may be body too: measure the head itself (only then, it
            # costs a microsecond). A head that began within the read that ended the request
            # before it is counted from the next read on; it is still bounded by one read more.
            line = len(self.url)
            size = line + sum([len(name) + len(value) + 4 for name, value in headers])
            if size > self._max_head:
                self._refusal = self._head_refusal(line, size)
                raise _Refused
        if self.parser.should_upgrade():
            # A WebSocket handshake: the connection is the consumer's from here. The read timer is
            # cancelled, not left to find nothing to do: uvicorn hands the transport to the
            # WebSocket protocol without calling connection_lost here, and a pending timer would
            # keep this protocol (its parser, buffers, scope) alive for request_read_timeout_s
            # after every upgrade.
            self._began = None
            self._cancel_read_timer()

    def _request_read(self) -> None:
        """The request's last byte is in: the next bytes are the next request's head."""
        self._began = None
        self._in_head = True
        self._head_bytes = 0

    def _read_due(self) -> None:
        self._read_timer = None
        began = self._began
        if began is None or self.transport.is_closing():
            return  # no request is being read: the next one arms the timer again
        due = began + self._read_timeout
        if self.loop.time() < due:
            self._read_timer = self.loop.call_at(due, self._read_due)
            return
        cycle = self.cycle
        if self._in_head:
            waiting = cycle is not None and not cycle.response_complete
        else:
            waiting = any(queued is cycle for queued, _ in self.pipeline)
        if waiting:
            # A pipelined request behind an answer still going out (uvicorn stops reading until
            # its turn): its time starts again.
            self._began = None
            self._request_begins()
            return
        if self._in_head:
            if self._head_bytes:
                self._refuse(errors.request_timeout(self._read_timeout))
            else:
                self.transport.close()  # a connection that never sent a request
            return
        scope: dict[str, Any] = cycle.scope  # type: ignore[assignment]
        if cycle.response_started or READ_TIMED_OUT in scope:
            self.transport.close()  # answered already, or told to answer a timeout ago: give up
            return
        self._body_timed_out(cycle, errors.request_timeout(self._read_timeout))
        self._began = None
        self._request_begins()  # whoever reads the body has one timeout more to answer

    def _body_timed_out(self, cycle: Any, exc: errors.GatewayError) -> None:
        """Tell whoever reads ``cycle``'s body (the ASGI app's receive) to answer ``exc``."""
        cycle.scope[READ_TIMED_OUT] = exc
        cycle.message_event.set()

    def _refuse(self, exc: errors.GatewayError) -> None:
        """Answer ``exc`` for a request no application has seen, in the envelope, and close."""
        transport = self.transport
        if transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete:  # else an answer is on its way: just close
            from gateway.pipeline import Passage, finish

            url = getattr(self, "url", b"")
            path = url.split(b"?", 1)[0][:_LOGGED_PATH].decode("latin-1")
            method = "-" if self._in_head else self.parser.get_method().decode("latin-1")
            passage = Passage(method, path, None, None, log_context=False)
            if self._began is not None:
                passage.started -= self.loop.time() - self._began  # the request's time, not ours
            rid = passage.request_id
            status, body, headers = errors.render(exc, path, rid)
            lines = [status_line(status)]
            lines += [b"%s: %s\r\n" % (name, value) for name, value in self.server_state.default_headers]
            lines += [b"%s: %s\r\n" % (k.lower().encode(), v.encode("latin-1")) for k, v in headers.items()]
            lines.append(b"content-length: %d\r\nx-request-id: %s\r\n\r\n" % (len(body), rid.encode()))
            transport.write(b"".join(lines) + body)
            finish(passage, status, "unmatched")
        transport.close()


_callbacks_module: Any = None
# Scope key of a request the relay handed to the ASGI app (GatewayServerProtocol.serve_asgi).
_DIVERTED = "gateway.diverted"


def _callbacks() -> Any:
    global _callbacks_module
    if _callbacks_module is None:
        from gateway.relay import callbacks  # imported on first use: it needs Django's apps

        _callbacks_module = callbacks
    return _callbacks_module


class _NoEvent:
    """What a :class:`LeanCycle` has for uvicorn's ``message_event``: nothing ever waits on it."""

    __slots__ = ()

    def set(self) -> None:
        return None

    def clear(self) -> None:
        return None


_NO_EVENT = _NoEvent()


class LeanCycle:
    """The request cycle of a pass-through request relayed on callbacks (:class:`~gateway.relay.callbacks.Relay`).

    It has the attributes of uvicorn's :class:`RequestResponseCycle` that the relay and the protocol
    use, and none of its ASGI machinery (``send``/``receive``, an ``asyncio.Event``, the scope's ASGI
    keys), which a request that never reaches the ASGI app does not need.
    """

    __slots__ = (
        "body",
        "default_headers",
        "disconnected",
        "flow",
        "keep_alive",
        "more_body",
        "on_response",
        "response_complete",
        "response_started",
        "scope",
        "transport",
    )
    message_event = _NO_EVENT
    body: bytes | bytearray

    def __init__(self, protocol: GatewayServerProtocol, scope: dict[str, Any], keep_alive: bool) -> None:
        self.scope = scope
        self.transport = protocol.transport
        self.flow = protocol.flow
        self.default_headers = protocol.server_state.default_headers
        self.keep_alive = keep_alive
        self.on_response = protocol.on_response_complete
        self.body = b""
        self.more_body = True
        self.disconnected = self.response_started = self.response_complete = False


class HandlerCycle(LeanCycle):
    """The request cycle of a request to a registered handler (:data:`gateway.fastroutes.HANDLERS`:
    ``POST /v1/responses``) run on the relay's protocol: the same ASGI application below uvicorn's
    layers (``GatewayASGIMiddleware`` around the handler: request id, body ceiling, metrics, access
    log), without uvicorn's ``RequestResponseCycle``, its proxy-headers middleware and the routers
    above the handler (``docs/performance.md``).

    It is the ASGI server side of one request, with uvicorn's semantics: ``receive`` gives the
    whole body once it is in (the request has a declared length, :meth:`GatewayServerProtocol._handled`),
    then ``http.disconnect`` once the client leaves or the answer is complete; ``send`` writes the
    head with the first body bytes, a body without a length chunked, and a stream's chunks held until
    the end of the loop turn that produced them (:class:`CoalescingCycle`'s rule); a body that did
    not arrive within the read timeout is told to the middleware (:data:`READ_TIMED_OUT`), which
    answers 408. The protocol's hooks reach it as they reach the callback relay: it is the
    connection's ``relay`` until its answer is complete.
    """

    __slots__ = ("chunked", "given", "held", "protocol", "waiter")

    def __init__(self, protocol: GatewayServerProtocol, scope: dict[str, Any], keep_alive: bool) -> None:
        super().__init__(protocol, scope, keep_alive)
        self.protocol = protocol
        self.given = False  # the body was handed to the application
        self.chunked = False
        self.held = HeldWrites(self)  # the answer's bytes not written yet (the head, a stream's chunks)
        self.waiter: asyncio.Future[None] | None = None  # receive() waiting for the body or the end

    @property
    def cycle(self) -> HandlerCycle:
        return self  # as the connection's relay: the cycle it answers

    async def run_asgi(self, app: Any) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            log.error("Exception in ASGI application", exc_info=exc)
            if not self.response_started:
                await self._send_500()
            else:
                self._cut()
        else:
            if not self.response_started and not self.disconnected:
                log.error("ASGI callable returned without starting response.")
                await self._send_500()
            elif not self.response_complete and not self.disconnected:
                log.error("ASGI callable returned without completing response.")
                self._cut()
        finally:
            self._release()

    async def _send_500(self) -> None:
        """uvicorn's answer to an application that failed before answering (a 500, and the
        connection closed after it), in the gateway's envelope."""
        self.keep_alive = False
        await errors.asgi_send(self.send, errors.server_error(), self.scope)

    def _cut(self) -> None:
        """End an answer that cannot be completed: what is held goes out, then the close."""
        self.held.flush()
        self.transport.close()

    # -- the protocol's hooks (as for the callback relay) ----------------------------------------

    def body_complete(self) -> None:
        self._wake()

    def client_gone(self) -> None:
        self._wake()

    def refuse(self, exc: errors.GatewayError) -> None:
        """The body did not arrive in time: the middleware answers ``exc`` when it reads it."""
        self.scope[READ_TIMED_OUT] = exc
        self._wake()

    def pump(self) -> None:
        return None  # a send waiting for the socket to drain is woken by the flow control

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        waiter = self.waiter = self.protocol.loop.create_future()
        try:
            await waiter
        finally:
            self.waiter = None

    def _release(self) -> None:
        protocol = self.protocol
        if protocol.relay is self:
            protocol.relay = None

    # -- ASGI ----------------------------------------------------------------------------------

    async def receive(self) -> dict[str, Any]:
        if not self.given and not self.disconnected and not self.response_complete:
            if self.more_body and READ_TIMED_OUT not in self.scope:
                await self._wait()
            if READ_TIMED_OUT in self.scope:
                return {"type": "http.request", "body": b"", "more_body": True}
            if not self.disconnected:
                self.given = True
                body, self.body = self.body, b""
                return {"type": "http.request", "body": bytes(body), "more_body": False}
        while not self.disconnected and not self.response_complete:
            await self._wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{kind}'.")
            self.response_started = True
            self.held.add(self._head(message["status"], message.get("headers", ())))
            if self.chunked:
                self.held.flush_soon()  # a stream's head goes out at once (with what this turn sends)
            return
        if self.response_complete or kind != "http.response.body":
            raise RuntimeError(f"Unexpected ASGI message '{kind}' sent.")
        body = message.get("body", b"")
        more = message.get("more_body", False)
        data = chunk(body, not more) if self.chunked else body
        if more:
            self.held.add(data)
            self.held.flush_soon()
            return
        self.transport.write(self.held.take() + data)
        self.response_complete = True
        self._release()  # before completing: that may start a pipelined request
        self._wake()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()

    def _head(self, status: int, headers: Any) -> bytes:
        """The status line and headers (uvicorn's: its default headers first, ``connection: close``
        when the connection ends, a body without a length chunked)."""
        lines = [status_line(status)]
        sized = closes = False
        for name, value in self.default_headers:
            lines += (name, b": ", value, b"\r\n")
        for name, value in headers:
            name = name.lower()
            if name == b"content-length":
                sized = True
            elif name == b"transfer-encoding":
                sized = value.lower() != b"chunked"
                self.chunked = not sized
            elif name == b"connection" and b"close" in [t.strip().lower() for t in value.split(b",")]:
                self.keep_alive = False
                closes = True
            lines += (name, b": ", value, b"\r\n")
        if not self.keep_alive and not closes:
            lines.append(b"connection: close\r\n")
        if not sized and not self.chunked and status not in (204, 304):
            self.chunked = True
            lines.append(b"transfer-encoding: chunked\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)


class GatewayServerProtocol(GatewayHttpProtocol):
    """The protocol ``manage.py serve`` runs the gateway with.

    A pass-through request on an idle connection (the usual keep-alive case) is recognised when its
    headers are parsed and relayed on callbacks by :class:`~gateway.relay.callbacks.Relay` on a
    :class:`LeanCycle`, without uvicorn's ASGI scope and request cycle. Pipelined ones (uvicorn
    queues them) are offered to :func:`~gateway.relay.callbacks.start` when their turn comes. What
    the relay does not take (:func:`~gateway.relay.callbacks.start` decides: a chunked body, an
    upstream that is not HTTP, other methods) goes to the ASGI app, whose fast path serves it. The
    hooks below feed the active relay the events it runs on.

    The keep-alive timeout is kept with one timer per connection that is re-armed only when it
    fires, instead of uvicorn's timer created and cancelled for every request.
    """

    _lean_routes: dict[bytes, tuple[str, Any]] | None = None
    _handled_routes: dict[bytes, tuple[str, Any]] | None = None
    relay: Any = None  # the callbacks.Relay answering on this connection now, if any
    _receiving = False  # bytes arrived since the last response completed
    _idle_since = 0.0

    # -- a request's head ----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        # uvicorn's scope is built only for a request that goes to the ASGI app (_scope()).
        self._request_begins()
        self.url = b""
        self.expect_100_continue = False
        self.headers = []

    def _scope(self) -> None:
        """uvicorn's scope for this request, with the URL and headers parsed so far."""
        url, headers, expect = self.url, self.headers, self.expect_100_continue
        HttpToolsProtocol.on_message_begin(self)
        self.url, self.headers, self.expect_100_continue = url, headers, expect
        self.scope["headers"] = headers

    def on_headers_complete(self) -> None:
        self._head_complete()
        cycle = self.cycle
        if (cycle is None or cycle.response_complete) and self._lean():
            return
        self._scope()
        HttpToolsProtocol.on_headers_complete(self)

    def _lean(self) -> bool:
        """Start a pass-through request on a :class:`LeanCycle`; False: it takes uvicorn's path."""
        parser = self.parser
        if parser.get_method() != b"POST" or parser.get_http_version() != "1.1" or parser.should_upgrade():
            return False
        routes = self._lean_routes
        if routes is None:
            from gateway import fastroutes

            routes = GatewayServerProtocol._lean_routes = {
                path.encode("ascii"): (path, route) for path, route in fastroutes.RELAYED.items()
            }
        url = self.url
        mark = url.find(b"?")
        found = routes.get(url if mark < 0 else url[:mark])
        if self.limit_concurrency is not None or self.root_path:
            return False
        if found is None:
            return self._handled(url, mark)
        path, route = found
        scope = {
            "type": "http",
            "method": "POST",
            "path": path,
            "query_string": b"" if mark < 0 else url[mark + 1 :],
            "headers": self.headers,
        }
        previous = self.cycle
        cycle: Any = LeanCycle(self, scope, parser.should_keep_alive())  # stands in for uvicorn's
        self.cycle = cycle
        if _callbacks().start(self, cycle, route):
            return True
        self.cycle = previous
        return False

    def _handled(self, url: bytes, mark: int) -> bool:
        """Run a request to a registered handler on a :class:`HandlerCycle`; False: it takes
        uvicorn's path (a body without a declared length, or over the ceiling, ``Expect``)."""
        routes = self._handled_routes
        if routes is None:
            from gateway import fastroutes

            routes = GatewayServerProtocol._handled_routes = {
                path.encode("ascii"): (path, GatewayASGIMiddleware(handler))
                for path, handler in fastroutes.HANDLERS.items()
            }
        raw_path = url if mark < 0 else url[:mark]
        found = routes.get(raw_path)
        if found is None:
            return False
        declared = b""
        for name, value in self.headers:
            if name == b"content-length":
                declared = value
            elif name == b"transfer-encoding" or name == b"expect":
                return False
        if not declared.isdigit() or int(declared) > get_config().server.max_request_body_size_bytes:
            return False
        path, app = found
        self._scope()
        scope: Any = self.scope
        scope["method"] = "POST"
        scope["path"] = path
        scope["raw_path"] = raw_path
        scope["query_string"] = b"" if mark < 0 else url[mark + 1 :]
        cycle = HandlerCycle(self, scope, self.parser.should_keep_alive())
        self.cycle = cycle  # type: ignore[assignment]
        self.relay = cycle
        task = self.loop.create_task(cycle.run_asgi(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)
        return True

    def serve_asgi(self, cycle: Any, body: bytes) -> None:
        """Hand a request the relay took to the ASGI app after all, its body read in full: the
        body decided (``Route.divert``, the Messages server-tool loop). Called as that body
        completes, so the parser is still on this request and uvicorn's scope and cycle can be built
        for it as for any other."""
        if type(cycle) is LeanCycle:
            cycle.response_complete = True  # the stand-in is done with: uvicorn's cycle takes over
            self._scope()
            scope: Any = self.scope
            scope[_DIVERTED] = True
            HttpToolsProtocol.on_headers_complete(self)  # builds the cycle and starts the app's task
            cycle = self.cycle
            start = False
        else:
            cycle.scope[_DIVERTED] = True
            start = True
        cycle.body = body
        cycle.more_body = False
        cycle.message_event.set()
        if start:
            HttpToolsProtocol._start_asgi_task(self, cycle, self.app)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        # A pipelined request, its turn come: the relay takes it if it can (it was queued with
        # uvicorn's cycle); everything else runs the ASGI app.
        found = None if _DIVERTED in cycle.scope else self._lean_route(cycle.scope["path"])
        if found is not None and _callbacks().start(self, cycle, found):
            return
        super()._start_asgi_task(cycle, app)

    def _lean_route(self, path: str) -> Any:
        from gateway import fastroutes

        return fastroutes.RELAYED.get(path)

    # -- a request's body ----------------------------------------------------------------------

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if isinstance(cycle, LeanCycle):
            if cycle.response_complete:
                return
            # The declared length is within the ceiling (Relay.admit). A body in one piece is kept
            # as it came; one in several is gathered in a bytearray (bytes += would copy it all
            # again for every piece).
            held = cycle.body
            if not held:
                cycle.body = body
            elif type(held) is bytearray:
                held += body
            else:
                cycle.body = bytearray(held) + body
            return
        super().on_body(body)
        relay = self.relay
        if relay is not None and relay.cycle is cycle:
            self.flow.resume_reading()  # the declared length is within the ceiling: read it all

    def on_message_complete(self) -> None:
        self._request_read()
        cycle = self.cycle
        if not isinstance(cycle, LeanCycle):
            HttpToolsProtocol.on_message_complete(self)
        elif cycle.response_complete:
            return
        else:
            cycle.more_body = False
        relay = self.relay
        if relay is not None and relay.cycle is cycle:
            relay.body_complete()

    def _body_timed_out(self, cycle: Any, exc: errors.GatewayError) -> None:
        relay = self.relay
        if relay is not None and relay.cycle is cycle:
            relay.refuse(exc)
            return
        super()._body_timed_out(cycle, exc)

    # -- the connection ------------------------------------------------------------------------

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        timer, self.timeout_keep_alive_task = self.timeout_keep_alive_task, None
        if timer is not None:
            timer.cancel()
        relay = self.relay
        if relay is not None:
            relay.client_gone()

    def resume_writing(self) -> None:
        super().resume_writing()
        relay = self.relay
        if relay is not None:
            relay.pump()

    # -- keep-alive ------------------------------------------------------------------------------

    def _unset_keepalive_if_required(self) -> None:
        # uvicorn cancels the keep-alive timer whenever bytes arrive; here they only mark the
        # connection busy, and the timer, when it fires, leaves a busy connection open.
        self._receiving = True

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._receiving = False
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self._keep_alive_due)

    def _keep_alive_due(self) -> None:
        """Close the connection if it has been idle for the keep-alive timeout, else look again later."""
        self.timeout_keep_alive_task = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if self._receiving or (cycle is not None and not cycle.response_complete):
            return  # busy: the response it is on arms the timer again when it completes
        due = self._idle_since + self.timeout_keep_alive
        if self.loop.time() >= due:
            self.transport.close()
        else:
            self.timeout_keep_alive_task = self.loop.call_at(due, self._keep_alive_due)


# --- graceful shutdown (gateway.lifecycle; what `manage.py serve` runs) -------------------------


class _DrainOnShutdown:
    """Starts the gateway's drain when uvicorn shuts a connection down: the response in flight on
    it still finishes (uvicorn's own behaviour), bounded by ``[server] shutdown_grace_s``, after
    which it ends with a ``failed`` terminal event (``gateway.lifecycle``)."""

    def shutdown(self) -> None:
        from gateway.lifecycle import drain

        drain.begin()
        super().shutdown()  # type: ignore[misc]


class DrainingServerProtocol(_DrainOnShutdown, GatewayServerProtocol):
    """:class:`GatewayServerProtocol` as ``manage.py serve`` runs it (see :class:`_DrainOnShutdown`)."""


class DrainingHttpProtocol(_DrainOnShutdown, GatewayHttpProtocol):
    """:class:`GatewayHttpProtocol` as ``manage.py serve`` runs it with ``direct_relay = false``."""


class DrainingWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's ``websockets-sansio`` protocol whose shutdown does not cut the connection at once (1012).

    uvicorn calls ``shutdown()`` on every connection when it stops; its WebSocket protocol fails an
    open connection with 1012 there and then, losing the responses in flight. Here the drain starts
    instead, and the consumer (``responses_app.consumers``) closes the connection itself once its
    last terminal event is sent; a connection still open after the grace and the flush margin is
    cut as uvicorn would. Relies on uvicorn's ``WebSocketsSansIOProtocol.shutdown``, ``loop``,
    ``transport``, ``handshake_complete`` and ``disconnected`` (uvicorn 0.54;
    ``tests/gateway/test_relay_contract.py`` checks them).

    The sans-I/O implementation, not uvicorn's legacy ``websockets`` one (deprecated in 0.54): with
    the legacy protocol every closed connection left memory behind that the process never gave back
    (about 100 KiB a connection; ``docs/websocket.md``, Memory).
    """

    def shutdown(self) -> None:
        from gateway.lifecycle import FLUSH_MARGIN_S, drain

        if not self.handshake_complete or self.disconnected or self.transport.is_closing():
            super().shutdown()
            return
        drain.begin()
        assert drain.deadline is not None
        self.loop.call_at(drain.deadline + FLUSH_MARGIN_S - 1.0, self._shutdown_if_open)

    def _shutdown_if_open(self) -> None:
        if not self.disconnected and not self.transport.is_closing():
            super().shutdown()
