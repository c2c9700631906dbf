"""uvicorn's httptools protocol, tuned for the gateway.

:class:`GatewayServerProtocol` (what ``manage.py serve`` runs) relays the pass-through routes
without the ASGI round trip (:mod:`gateway.direct`); for everything else, and in
:class:`GatewayHttpProtocol`, there is one change to uvicorn: a sized response goes out in one write.

uvicorn writes the status line and headers to the socket as soon as the application sends
``http.response.start``, and the body with a second write. For a response with a
``Content-Length`` (every JSON answer, relayed or our own) the headers are useless to the client
without the body, so here they are held until the first body message and written together with it:
one system call per response instead of two, which is a measurable share of a small pass-through
request's cost (``docs/performance.md``). Streamed responses (no length: SSE, chunked) are written
exactly as uvicorn writes them, so their headers still reach the client at once.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.websockets.websockets_impl import WebSocketProtocol


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
    """A request/response cycle that writes a sized response's head together with its body."""

    _held: bytes = b""

    async def send(self, message: Any) -> None:
        if (
            not self.response_started
            and message["type"] == "http.response.start"
            and self.scope["method"] != "HEAD"
            and _sized(message)
        ):
            transport, holder = self.transport, _HeldHead()
            self.transport = holder  # type: ignore[assignment]
            try:
                await super().send(message)
            finally:
                self.transport = transport
            self._held = holder.data
            return
        if self._held:
            transport, proxy = self.transport, _WithHead(self.transport, self._held)
            self._held = b""
            self.transport = proxy  # type: ignore[assignment]
            try:
                await super().send(message)
            finally:
                self.transport = transport
                if proxy.head and not self.disconnected:
                    transport.write(proxy.head)  # nothing was written (an error): head alone
            return
        await super().send(message)


class GatewayHttpProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` whose requests run as :class:`CoalescingCycle`."""

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        cycle.__class__ = CoalescingCycle
        super()._start_asgi_task(cycle, app)


_direct_module: Any = None


def _direct() -> Any:
    global _direct_module
    if _direct_module is None:
        from gateway import direct  # imported on first use: it needs Django's settings

        _direct_module = direct
    return _direct_module


class _NoEvent:
    """What a :class:`LeanCycle` has for uvicorn's ``message_event``: nothing ever waits on it."""

    __slots__ = ()

    def set(self) -> None:
        return None

    def clear(self) -> None:
        return None


_NO_EVENT = _NoEvent()


class LeanCycle:
    """The request cycle of a pass-through request relayed on callbacks (:class:`gateway.direct.Relay`).

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


class GatewayServerProtocol(GatewayHttpProtocol):
    """The protocol ``manage.py serve`` runs the gateway with.

    A pass-through request on an idle connection (the usual keep-alive case) is recognised when its
    headers are parsed and relayed on callbacks by :class:`gateway.direct.Relay` on a
    :class:`LeanCycle`, without uvicorn's ASGI scope and request cycle. Pipelined ones (uvicorn
    queues them) are taken by :func:`gateway.direct.start` when their turn comes; those it cannot
    take (a chunked body, an upstream that is not HTTP) run :func:`gateway.direct.serve` in the task
    uvicorn would have run the ASGI app in; every other request goes to the ASGI app. The hooks below
    feed the active relay the events it runs on.

    The keep-alive timeout is kept with one timer per connection that is re-armed only when it
    fires, instead of uvicorn's timer created and cancelled for every request.
    """

    _routes: dict[str, Any] | None = None
    _lean_routes: dict[bytes, tuple[str, Any]] | None = None
    # False: every eligible request takes the task (tests run the pass-through cases both ways).
    callbacks = True
    relay: Any = None  # the gateway.direct.Relay answering on this connection now, if any
    _receiving = False  # bytes arrived since the last response completed
    _idle_since = 0.0

    # -- a request's head ----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        # uvicorn's scope is built only for a request that goes to the ASGI app (_scope()).
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
        cycle = self.cycle
        if self.callbacks and (cycle is None or cycle.response_complete) and self._lean():
            return
        self._scope()
        super().on_headers_complete()

    def _lean(self) -> bool:
        """Start a pass-through request on a :class:`LeanCycle`; False: it takes uvicorn's path."""
        parser = self.parser
        if parser.get_method() != b"POST" or parser.get_http_version() != "1.1" or parser.should_upgrade():
            return False
        routes = GatewayServerProtocol._lean_routes
        if routes is None:
            routes = GatewayServerProtocol._lean_routes = {
                path.encode("ascii"): (path, route) for path, route in self._fast_routes().items()
            }
        url = self.url
        mark = url.find(b"?")
        found = routes.get(url if mark < 0 else url[:mark])
        if found is None or self.limit_concurrency is not None or self.root_path:
            return False
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
        if _direct().start(self, cycle, route):
            return True
        self.cycle = previous
        return False

    @staticmethod
    def _fast_routes() -> dict[str, Any]:
        routes = GatewayServerProtocol._routes
        if routes is None:
            from gateway.fastpath import fast_routes

            routes = GatewayServerProtocol._routes = fast_routes()
        return routes

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        scope = cycle.scope
        route = self._fast_routes().get(scope["path"])
        if route is not None:
            direct = _direct()
            if self.callbacks and direct.start(self, cycle, route):
                return
            if direct.eligible(scope, route):
                task = self.loop.create_task(direct.serve(self, cycle, route))
                task.add_done_callback(self.tasks.discard)
                self.tasks.add(task)
                return
        super()._start_asgi_task(cycle, app)

    # -- a request's body ----------------------------------------------------------------------

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if type(cycle) is LeanCycle:
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
        cycle = self.cycle
        if type(cycle) is not LeanCycle:
            super().on_message_complete()
        elif cycle.response_complete:
            return
        else:
            cycle.more_body = False
        relay = self.relay
        if relay is not None and relay.cycle is cycle:
            relay.body_complete()

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


class DrainingServerProtocol(GatewayServerProtocol):
    """:class:`GatewayServerProtocol` whose shutdown starts the gateway's drain: the response in
    flight on this connection still finishes (uvicorn's own behaviour), bounded by
    ``[server] shutdown_grace_s``, after which it ends with a ``failed`` terminal event."""

    def shutdown(self) -> None:
        from gateway.lifecycle import drain

        drain.begin()
        super().shutdown()


class DrainingWebSocketProtocol(WebSocketProtocol):
    """uvicorn's ``websockets`` protocol whose shutdown does not cut the connection at once (1012).

    uvicorn calls ``shutdown()`` on every connection when it stops; its WebSocket protocol fails an
    open connection with 1012 there and then, losing the responses in flight. Here the drain starts
    instead, and the consumer (``responses_app.consumers``) closes the connection itself once its
    last terminal event is sent; a connection still open after the grace and the flush margin is
    cut as uvicorn would. Relies on uvicorn's ``WebSocketProtocol.shutdown``, ``loop``, ``transport``
    and ``handshake_completed_event`` (uvicorn 0.54; ``tests/gateway/test_server_protocol.py``
    checks them).
    """

    def shutdown(self) -> None:
        from gateway.lifecycle import FLUSH_MARGIN_S, drain

        completed = getattr(self, "handshake_completed_event", None)
        if completed is None or not completed.is_set() or self.transport.is_closing():
            super().shutdown()
            return
        drain.begin()
        assert drain.deadline is not None
        self.loop.call_at(drain.deadline + FLUSH_MARGIN_S - 1.0, self._shutdown_if_open)

    def _shutdown_if_open(self) -> None:
        if not self.transport.is_closing():
            super().shutdown()
